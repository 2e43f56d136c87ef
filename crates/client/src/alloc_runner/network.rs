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

/// The host ports this process forwards into a group's namespace, with the alloc each
/// goes to. A forward takes every connection to a local address on its port (the
/// portmap plugin's DNAT comes before any listener), so one port goes to one alloc.
static FORWARDED: Mutex<BTreeMap<u16, String>> = Mutex::new(BTreeMap::new());

/// Why the group's network could not be made.
#[derive(Debug, thiserror::Error)]
enum SetupError {
    #[error(
        "host port {port} is forwarded to alloc {holder} already: one host port goes to one alloc"
    )]
    Forwarded { port: u16, holder: String },
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
            if alloc.group.network_mode != NetworkMode::Bridge {
                return Ok(());
            }
            if let Some(recorded) = alloc.resources.network() {
                if recorded.attached.is_some() && NetNs::existing(&recorded.namespace).is_some() {
                    tracing::info!("keeping the group's network namespace after an agent restart");
                    let mut forwarded = FORWARDED.lock().unwrap_or_else(|p| p.into_inner());
                    for port in host_ports(alloc) {
                        forwarded.insert(port, alloc.id.clone());
                    }
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
            claim_host_ports(alloc).map_err(|e| fail(e.to_string()))?;
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
            };
            // The intent first: a restarted agent undoes what this leaves half made.
            alloc.resources.set_network(Some(network.clone()));
            alloc.save_resources(berth_state::Commit::Durable);
            let made = berth_sys::blocking::run(|| -> Result<cni::AddResult, SetupError> {
                let namespace = NetNs::create(&name)?;
                let ports = port_mappings(alloc);
                let attachment = attachment(&namespace, &ports);
                let (cni, list) = bridge(alloc);
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
                            free_host_ports(alloc);
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
    /// Detaches and removes the group's network namespace, if one is recorded: for an
    /// alloc that ended while the agent was down (restore).
    pub fn release_network(&self) {
        release_network(self);
    }
}

/// Detaches and removes the alloc's namespace, if it has one recorded, and forgets it.
/// One whose DEL fails stays recorded, its host ports held (another alloc given one of
/// them would sit behind the forward left), for a restarted agent to try again.
fn release_network(alloc: &AllocRunner) {
    let Some(recorded) = alloc.resources.network() else {
        return;
    };
    if release(alloc, &recorded).is_err() {
        return;
    }
    free_host_ports(alloc);
    alloc.resources.set_network(None);
    alloc.save_resources(berth_state::Commit::Durable);
}

/// The group's numbered host ports.
fn host_ports(alloc: &AllocRunner) -> Vec<u16> {
    alloc.group.ports.iter().filter_map(|p| p.number).collect()
}

/// Takes the group's host ports for the alloc: none may be forwarded to another alloc,
/// nor listened on by anything on the host (the agent's own API, sshd, …), which the
/// forward would silently take over. All or none.
fn claim_host_ports(alloc: &AllocRunner) -> Result<(), SetupError> {
    let mut forwarded = FORWARDED.lock().unwrap_or_else(|p| p.into_inner());
    let ports = host_ports(alloc);
    for &port in &ports {
        match forwarded.get(&port) {
            Some(holder) if *holder != alloc.id => {
                return Err(SetupError::Forwarded {
                    port,
                    holder: holder.clone(),
                });
            }
            Some(_) => {}
            None if !super::ports::free_on_host(port) => return Err(SetupError::InUse { port }),
            None => {}
        }
    }
    for port in ports {
        forwarded.insert(port, alloc.id.clone());
    }
    Ok(())
}

fn free_host_ports(alloc: &AllocRunner) {
    let mut forwarded = FORWARDED.lock().unwrap_or_else(|p| p.into_inner());
    forwarded.retain(|_, holder| *holder != alloc.id);
}

/// CNI DEL on the network it was attached to (given the ADD's result when there was
/// one: each plugin finds what it made), then the namespace's removal: a file left
/// unmounted goes too. The DEL comes first (the bridge plugin finds the alloc's
/// masquerade rules from inside the namespace); the removal runs even when the DEL
/// failed, and the DEL's error is returned.
fn release(alloc: &AllocRunner, recorded: &GroupNetwork) -> Result<(), SetupError> {
    berth_sys::blocking::run(|| {
        let ports = port_mappings(alloc);
        let (cni, list) = match &recorded.bridge {
            Some((name, subnet)) => network_list(alloc, name, subnet),
            None => bridge(alloc),
        };
        let attachment = Attachment {
            container_id: &recorded.namespace,
            netns: &recorded.path,
            ifname: IFNAME,
            port_mappings: &ports,
        };
        let detached = cni.del(&list, &attachment, recorded.attached.as_ref());
        if let Err(error) = &detached {
            tracing::error!(%error, "detaching the group's network namespace");
        }
        if let Err(error) =
            NetNs::named(&recorded.namespace).and_then(|namespace| namespace.remove())
        {
            tracing::error!(%error, "removing the group's network namespace");
        }
        Ok(detached?)
    })
}

fn bridge(alloc: &AllocRunner) -> (Cni, cni::NetworkList) {
    let settings = &alloc.node.config.bridge;
    network_list(alloc, &settings.name, &settings.subnet)
}

fn network_list(alloc: &AllocRunner, name: &str, subnet: &str) -> (Cni, cni::NetworkList) {
    (
        Cni::new(&alloc.node.config.bridge.cni_path),
        cni::bridge_network(name, name, subnet, ADMIN_CHAIN),
    )
}

fn attachment<'a>(namespace: &'a NetNs, ports: &'a [PortMapping]) -> Attachment<'a> {
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
