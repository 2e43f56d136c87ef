//! The group's own network (`network { mode = "bridge" }`), as a Nomad client makes it:
//! before any task starts, a namespace named after the alloc (`/run/netns/<alloc id>`),
//! attached to the node's bridge by the CNI plugins, with the group's host ports
//! forwarded to their `to`; every task of the group joins it. After the tasks, it is
//! detached (CNI DEL, given what the ADD made) and removed.
//!
//! It is recorded before it is made, so a restarted agent finds it: an alloc that runs
//! on keeps it, one that ended (or was half set up) has it detached and removed.

use std::collections::BTreeMap;
use std::sync::Mutex;

use crate::config::BridgeSettings;
use berth_jobspec::NetworkMode;
use berth_model::hook_resources::GroupNetwork;
use berth_sys::network::cni::{self, Attachment, Cni, PortMapping};
use berth_sys::network::netns::NetNs;

use super::{AllocHook, AllocRunner};
use crate::task_runner::hooks::{BoxFuture, HookError};

/// The firewall plugin's chain for the operator's own rules, as Nomad names it.
const ADMIN_CHAIN: &str = "NOMAD-ADMIN";
/// The interface inside the namespace.
const IFNAME: &str = "eth0";

pub(super) struct NetworkHook;

/// The host ports this process forwards into a namespace (a group's, or an image task's
/// own), with what each goes to ("alloc <id>", or a task of one). A forward takes
/// every connection to a local address on its port (the portmap plugin's DNAT comes
/// before any listener), so one port goes to one namespace.
static FORWARDED: Mutex<BTreeMap<u16, Holder>> = Mutex::new(BTreeMap::new());

/// What a forwarded host port goes to: an alloc's group, or one of its tasks.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Holder {
    pub alloc: String,
    pub task: Option<String>,
}

impl std::fmt::Display for Holder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.task {
            Some(task) => write!(f, "task {task:?} of alloc {}", self.alloc),
            None => write!(f, "alloc {}", self.alloc),
        }
    }
}

/// The host ports forwarded now, with what each goes to: also those of finished allocs
/// whose release failed, whose forwards stand until it succeeds.
pub fn forwarded_ports() -> BTreeMap<u16, Holder> {
    FORWARDED.lock().unwrap_or_else(|p| p.into_inner()).clone()
}

/// Why a network could not be made.
#[derive(Debug, thiserror::Error)]
pub(super) enum SetupError {
    #[error("host port {port} is forwarded to {holder} already: one host port goes to one network")]
    Forwarded { port: u16, holder: Holder },
    #[error(
        "host port {port} is in use on this node: forwarding it would take the traffic of what listens there"
    )]
    InUse { port: u16 },
    #[error(transparent)]
    Namespace(#[from] berth_sys::network::netns::NetnsError),
    #[error(transparent)]
    Cni(#[from] cni::CniError),
}

impl AllocHook for NetworkHook {
    fn name(&self) -> &'static str {
        "network"
    }

    fn prerun<'a>(&'a self, alloc: &'a AllocRunner) -> BoxFuture<'a, Result<(), HookError>> {
        Box::pin(async move {
            alloc.restore_task_networks();
            if alloc.group.network_mode != NetworkMode::Bridge {
                return Ok(());
            }
            if let Some(recorded) = alloc.resources.network() {
                if recorded.attached.is_some() && NetNs::existing(&recorded.namespace).is_some() {
                    tracing::info!("keeping the group's network namespace after an agent restart");
                    hold_ports(&group_holder(alloc), &host_ports(alloc));
                    return Ok(());
                }
                // Half made when the agent stopped: undone, then made again.
                if let Err(error) = release(alloc, &recorded) {
                    return Err(HookError {
                        hook: "network".into(),
                        message: format!(
                            "the group's bridge network, half made before an agent restart, could not be undone: {error}"
                        ),
                    });
                }
            }
            let fail = |message: String| HookError {
                hook: "network".into(),
                message,
            };
            claim_ports(&group_holder(alloc), &host_ports(alloc))
                .map_err(|e| fail(e.to_string()))?;
            let name = alloc.id.clone();
            let mut network = GroupNetwork {
                namespace: name.clone(),
                path: std::path::Path::new(berth_sys::network::netns::NETNS_DIR).join(&name),
                address: None,
                attached: None,
                bridge: Some((
                    alloc.node.config.bridge.name.clone(),
                    alloc.node.config.bridge.subnet.clone(),
                )),
                forwarded: Vec::new(),
            };
            // The intent first: a restarted agent undoes what this leaves half made.
            alloc.resources.set_network(Some(network.clone()));
            alloc.save_resources(berth_state::Commit::Durable);
            let made = berth_sys::blocking::run(|| -> Result<cni::AddResult, SetupError> {
                let namespace = NetNs::create(&name)?;
                let ports = port_mappings(alloc);
                let attachment = attachment(&namespace, &ports);
                let (cni, list) = bridge(&alloc.node.config.bridge);
                Ok(cni.add(&list, &attachment)?)
            });
            match made {
                Ok(added) => {
                    network.address = added.address().map(str::to_string);
                    network.attached = Some(added.raw);
                    tracing::info!(address = ?network.address, "attached the group's network namespace to the bridge");
                    alloc.resources.set_network(Some(network));
                    alloc.save_resources(berth_state::Commit::Durable);
                    Ok(())
                }
                Err(why) => {
                    let mut message = format!("the group's bridge network: {why}");
                    match release(alloc, &network) {
                        Ok(()) => {
                            free_ports(&group_holder(alloc));
                            alloc.resources.set_network(None);
                            alloc.save_resources(berth_state::Commit::Durable);
                        }
                        // Kept recorded (and its ports held): the alloc's release, or a
                        // restarted agent's, tries again.
                        Err(error) => {
                            message.push_str(&format!("; undoing it failed too: {error}"))
                        }
                    }
                    Err(fail(message))
                }
            }
        })
    }

    fn postrun<'a>(&'a self, alloc: &'a AllocRunner) -> BoxFuture<'a, ()> {
        Box::pin(async move { release_network(alloc) })
    }
}

impl AllocRunner {
    /// Detaches and removes the group's network namespace, if one is recorded, and the
    /// tasks' own: for an alloc that ended while the agent was down (restore).
    pub fn release_network(&self) {
        release_network(self);
    }
}

/// Detaches and removes the alloc's namespace, if it has one recorded, and forgets it.
/// One whose DEL fails stays recorded, its host ports held (another alloc given one of
/// them would sit behind the forward left), for a restarted agent to try again.
fn release_network(alloc: &AllocRunner) {
    alloc.release_task_networks();
    let Some(recorded) = alloc.resources.network() else {
        return;
    };
    if release(alloc, &recorded).is_err() {
        return;
    }
    free_ports(&group_holder(alloc));
    alloc.resources.set_network(None);
    alloc.save_resources(berth_state::Commit::Durable);
}

/// The group's numbered host ports.
fn host_ports(alloc: &AllocRunner) -> Vec<u16> {
    alloc.group.ports.iter().filter_map(|p| p.number).collect()
}

/// What the group's forwards are held for.
fn group_holder(alloc: &AllocRunner) -> Holder {
    Holder {
        alloc: alloc.id.clone(),
        task: None,
    }
}

/// Takes host ports for `holder`: none may be forwarded to another namespace, nor
/// listened on by anything on the host (the agent's own API, sshd, …), which the
/// forward would silently take over. All or none.
pub(super) fn claim_ports(holder: &Holder, ports: &[u16]) -> Result<(), SetupError> {
    let mut forwarded = FORWARDED.lock().unwrap_or_else(|p| p.into_inner());
    for &port in ports {
        match forwarded.get(&port) {
            Some(other) if other != holder => {
                return Err(SetupError::Forwarded {
                    port,
                    holder: other.clone(),
                });
            }
            Some(_) => {}
            None if !super::ports::free_on_host(port) => return Err(SetupError::InUse { port }),
            None => {}
        }
    }
    for &port in ports {
        forwarded.insert(port, holder.clone());
    }
    Ok(())
}

/// Holds `ports` for `holder` again, as a restarted agent finds them forwarded.
pub(super) fn hold_ports(holder: &Holder, ports: &[u16]) {
    let mut forwarded = FORWARDED.lock().unwrap_or_else(|p| p.into_inner());
    for &port in ports {
        forwarded.insert(port, holder.clone());
    }
}

pub(super) fn free_ports(holder: &Holder) {
    let mut forwarded = FORWARDED.lock().unwrap_or_else(|p| p.into_inner());
    forwarded.retain(|_, other| other != holder);
}

/// CNI DEL on the network it was attached to (given the ADD's result when there was
/// one: each plugin finds what it made), then the namespace's removal: a file left
/// unmounted goes too. The DEL comes first (the bridge plugin finds the alloc's
/// masquerade rules from inside the namespace); the removal runs even when the DEL
/// failed, and the DEL's error is returned.
fn release(alloc: &AllocRunner, recorded: &GroupNetwork) -> Result<(), SetupError> {
    let ports = port_mappings(alloc);
    release_recorded(&alloc.node.config.bridge, recorded, &ports)
}

/// Detaches `recorded` (CNI DEL, with the forwards its ADD was given) and removes its
/// namespace: a group's or a task's.
pub(super) fn release_recorded(
    settings: &BridgeSettings,
    recorded: &GroupNetwork,
    ports: &[PortMapping],
) -> Result<(), SetupError> {
    berth_sys::blocking::run(|| {
        let (cni, list) = match &recorded.bridge {
            Some((name, subnet)) => network_list(settings, name, subnet),
            None => bridge(settings),
        };
        let attachment = Attachment {
            container_id: &recorded.namespace,
            netns: &recorded.path,
            ifname: IFNAME,
            port_mappings: ports,
        };
        let detached = cni.del(&list, &attachment, recorded.attached.as_ref());
        if let Err(error) = &detached {
            tracing::error!(%error, namespace = %recorded.namespace, "detaching a network namespace");
        }
        if let Err(error) =
            NetNs::named(&recorded.namespace).and_then(|namespace| namespace.remove())
        {
            tracing::error!(%error, namespace = %recorded.namespace, "removing a network namespace");
        }
        Ok(detached?)
    })
}

/// The node's bridge network as the operator configured it now.
pub(super) fn bridge(settings: &BridgeSettings) -> (Cni, cni::NetworkList) {
    network_list(settings, &settings.name, &settings.subnet)
}

fn network_list(settings: &BridgeSettings, name: &str, subnet: &str) -> (Cni, cni::NetworkList) {
    (
        Cni::new(&settings.cni_path),
        cni::bridge_network(name, name, subnet, ADMIN_CHAIN),
    )
}

pub(super) fn attachment<'a>(namespace: &'a NetNs, ports: &'a [PortMapping]) -> Attachment<'a> {
    Attachment {
        container_id: namespace.name(),
        netns: namespace.path(),
        ifname: IFNAME,
        port_mappings: ports,
    }
}

/// Every numbered port of the group, TCP and UDP, from the host's number to the one
/// inside (its `to`, or the same number).
fn port_mappings(alloc: &AllocRunner) -> Vec<PortMapping> {
    alloc
        .group
        .ports
        .iter()
        .filter_map(|port| Some((port.number?, port.inside(NetworkMode::Bridge)?)))
        .flat_map(|(host, inside)| {
            ["tcp", "udp"].map(|protocol| PortMapping {
                host_port: host,
                container_port: inside,
                protocol: protocol.into(),
                host_ip: None,
            })
        })
        .collect()
}
