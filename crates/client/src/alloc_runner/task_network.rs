//! An image task's own network: Docker's default `bridge` network for a docker task in a
//! host-mode group. The driver asks for it when it spawns the task (`image.spawn-with-
//! options`), naming the group ports to forward (Docker's `ports`); the host makes a
//! namespace named after the alloc and the task's place in the group
//! (`/run/netns/<alloc id>.<n>`), attaches it to the node's bridge with the CNI plugins
//! as a bridge group's, forwards each port from its host number to its `to`, and gives
//! the task its own `hosts` and `resolv.conf`.
//!
//! It is recorded before it is made, as the group's is: the task's restarts find it
//! again; the task's end for good, the alloc's end, or a restarted agent that finds the
//! alloc ended (or the network half made) detaches and removes it. One start call gets
//! one network (`host_api::image` refuses a second with other ports).

use std::path::PathBuf;
use std::sync::Arc;

use berth_jobspec::Group;
use berth_model::driver::{ReleaseTaskNetwork, TaskNetwork, TaskNetworkMaker, TaskNetworkRefusal};
use berth_model::hook_resources::{ForwardedPort, GroupNetwork, HookResources};
use berth_state::{Commit, StateStore};
use berth_sys::network::cni::{self, PortMapping};
use berth_sys::network::netns::{NETNS_DIR, NetNs, NetnsError};

use super::AllocRunner;
use super::network::{
    Holder, SetupError, attachment, bridge, claim_ports, free_ports, hold_ports, release_recorded,
};
use crate::config::AgentConfig;

/// What a task runner needs to make its task's own network.
pub(crate) struct TaskNetworkSetup {
    alloc_id: String,
    task: String,
    /// The task's place in its group: its namespace's name.
    index: usize,
    group: Arc<Group>,
    config: Arc<AgentConfig>,
    resources: Arc<HookResources>,
    store: Arc<StateStore>,
    /// Where the alloc's own `/etc` files go (`None`: an alloc of the old layout).
    etc_dir: Option<PathBuf>,
}

impl AllocRunner {
    /// The maker of task `task`'s own network, for an image task in a host-mode group
    /// (`None` in a bridge-mode group: every task is in the group's namespace).
    pub(super) fn own_network_maker(&self, task: &str) -> Option<TaskNetworkMaker> {
        if self.group.network_mode != berth_jobspec::NetworkMode::Host {
            return None;
        }
        let index = self.group.tasks.iter().position(|t| t.name == task)?;
        let setup = TaskNetworkSetup {
            alloc_id: self.id.clone(),
            task: task.to_string(),
            index,
            group: self.group.clone(),
            config: self.node.config.clone(),
            resources: self.resources.clone(),
            store: self.node.store.clone(),
            etc_dir: self.alloc_dir.group_etc(),
        };
        Some(TaskNetworkMaker(Arc::new(move |labels| setup.make(labels))))
    }

    /// At the alloc's start (also after an agent restart): the tasks' own networks that
    /// a restarted agent finds attached are kept, their host ports held again; those
    /// half made are undone (the task's next spawn makes them again).
    pub(super) fn restore_task_networks(&self) {
        for (task, recorded) in self.resources.task_networks() {
            let holder = holder(&self.id, &task);
            if recorded.attached.is_some() && NetNs::existing(&recorded.namespace).is_some() {
                let ports: Vec<u16> = recorded.forwarded.iter().map(|p| p.host).collect();
                hold_ports(&holder, &ports);
                continue;
            }
            if release_recorded(&self.node.config.bridge, &recorded, &mappings(&recorded)).is_ok() {
                free_ports(&holder);
                self.resources.set_task_network(&task, None);
                self.save_resources(Commit::Durable);
            }
        }
    }

    /// At the alloc's end: every task's own network is detached and removed. One whose
    /// DEL fails stays recorded, its ports held, for a restarted agent to try again.
    pub(super) fn release_task_networks(&self) {
        for task in self.resources.task_networks().keys() {
            release_one(&self.node, &self.id, &self.resources, task);
        }
    }

    /// What releases task `task`'s own network once the task is over for good (no
    /// restart to come), before its alloc ends: its forwards then lead nowhere, and a
    /// later task of the alloc may forward the same ports (attack review).
    pub(super) fn own_network_releaser(&self, task: &str) -> Option<ReleaseTaskNetwork> {
        if self.group.network_mode != berth_jobspec::NetworkMode::Host {
            return None;
        }
        let (node, id, resources, task) = (
            self.node.clone(),
            self.id.clone(),
            self.resources.clone(),
            task.to_string(),
        );
        Some(Arc::new(move || {
            berth_sys::blocking::run(|| release_one(&node, &id, &resources, &task))
        }))
    }
}

/// Detaches and removes task `task`'s own network, if it has one recorded, and forgets
/// it; one whose DEL fails stays recorded, its ports held.
fn release_one(node: &super::NodeContext, alloc_id: &str, resources: &HookResources, task: &str) {
    let Some(recorded) = resources.task_networks().remove(task) else {
        return;
    };
    if release_recorded(&node.config.bridge, &recorded, &mappings(&recorded)).is_err() {
        return;
    }
    free_ports(&holder(alloc_id, task));
    resources.set_task_network(task, None);
    super::save_resources(&node.store, alloc_id, resources, Commit::Durable);
}

/// What a task's forwards are held for.
fn holder(alloc_id: &str, task: &str) -> Holder {
    Holder {
        alloc: alloc_id.to_string(),
        task: Some(task.to_string()),
    }
}

/// A recorded network's forwards, TCP and UDP, as its ADD was given them.
fn mappings(recorded: &GroupNetwork) -> Vec<PortMapping> {
    recorded
        .forwarded
        .iter()
        .flat_map(|port| {
            ["tcp", "udp"].map(|protocol| PortMapping {
                host_port: port.host,
                container_port: port.inside,
                protocol: protocol.into(),
                host_ip: None,
            })
        })
        .collect()
}

impl TaskNetworkSetup {
    fn make(&self, labels: &[String]) -> Result<TaskNetwork, TaskNetworkRefusal> {
        let forwarded = self.forwarded(labels)?;
        let holder = holder(&self.alloc_id, &self.task);
        let settings = &self.config.bridge;
        if let Some(recorded) = self.resources.task_networks().get(&self.task) {
            if recorded.attached.is_some()
                && recorded.forwarded == forwarded
                && NetNs::existing(&recorded.namespace).is_some()
            {
                // A restart of the task: the namespace it had.
                return self.given(recorded);
            }
            // Half made, or other ports asked for: undone, then made again.
            release_recorded(settings, recorded, &mappings(recorded))
                .map_err(|e| refusal(format!("undoing the task's earlier network: {e}")))?;
            free_ports(&holder);
            self.resources.set_task_network(&self.task, None);
            self.save(Commit::Durable);
        }
        let (cni, list) = bridge(settings);
        cni.check(&list).map_err(|e| {
            refusal(format!(
                "{e}: Docker's default network needs the CNI reference plugins (Debian's \
                 containernetworking-plugins) in the agent's cni_path; \
                 network_mode = \"host\" keeps the task on the host's network"
            ))
        })?;
        let hosts: Vec<u16> = forwarded.iter().map(|p| p.host).collect();
        claim_ports(&holder, &hosts).map_err(|e| refusal(e.to_string()))?;
        let name = format!("{}.{}", self.alloc_id, self.index);
        // Never another task's (an alloc restored against a job whose tasks moved).
        let records = self.resources.task_networks();
        if let Some((other, _)) = records
            .iter()
            .find(|(task, n)| **task != self.task && n.namespace == name)
        {
            free_ports(&holder);
            return Err(refusal(format!(
                "its namespace {name} is task {other:?}'s already"
            )));
        }
        let mut network = GroupNetwork {
            namespace: name.clone(),
            path: std::path::Path::new(NETNS_DIR).join(&name),
            address: None,
            attached: None,
            bridge: Some((settings.name.clone(), settings.subnet.clone())),
            forwarded,
        };
        // The intent first: a restarted agent undoes what this leaves half made.
        self.resources
            .set_task_network(&self.task, Some(network.clone()));
        self.save(Commit::Durable);
        let ports = mappings(&network);
        let made = (|| -> Result<cni::AddResult, SetupError> {
            let namespace = NetNs::create(&name)?;
            Ok(cni.add(&list, &attachment(&namespace, &ports))?)
        })();
        match made {
            Ok(added) => {
                network.address = added.address().map(str::to_string);
                network.attached = Some(added.raw);
                tracing::info!(task = %self.task, address = ?network.address, "attached the task's own network namespace to the bridge");
                self.resources
                    .set_task_network(&self.task, Some(network.clone()));
                self.save(Commit::Durable);
                self.given(&network)
            }
            Err(SetupError::Namespace(NetnsError::Exists { name })) => {
                // Not this attempt's to undo: what is there stays (attack review).
                free_ports(&holder);
                self.resources.set_task_network(&self.task, None);
                self.save(Commit::Durable);
                Err(refusal(format!(
                    "network namespace {name:?} exists already"
                )))
            }
            Err(why) => {
                let mut message = format!("attaching it to the node's bridge: {why}");
                match release_recorded(settings, &network, &ports) {
                    Ok(()) => {
                        free_ports(&holder);
                        self.resources.set_task_network(&self.task, None);
                        self.save(Commit::Durable);
                    }
                    // Kept recorded (and its ports held): the alloc's end, or a
                    // restarted agent, tries again.
                    Err(error) => message.push_str(&format!("; undoing it failed too: {error}")),
                }
                Err(refusal(message))
            }
        }
    }

    /// The group ports `labels` names, from their host number to their `to`.
    fn forwarded(&self, labels: &[String]) -> Result<Vec<ForwardedPort>, TaskNetworkRefusal> {
        let mut forwarded: Vec<ForwardedPort> = Vec::new();
        for label in labels {
            if forwarded.iter().any(|p| p.label == *label) {
                continue;
            }
            let Some(port) = self.group.ports.iter().find(|p| p.label == *label) else {
                let known: Vec<&str> = self.group.ports.iter().map(|p| p.label.as_str()).collect();
                return Err(refusal(format!(
                    "ports names {label:?}, which the group's network does not define{}",
                    if known.is_empty() {
                        " (it defines no port)".to_string()
                    } else {
                        format!(" (its ports: {})", known.join(", "))
                    }
                )));
            };
            let Some(host) = port.number else {
                return Err(refusal(format!(
                    "port {label:?} has no host port on this node"
                )));
            };
            forwarded.push(ForwardedPort {
                label: label.clone(),
                host,
                inside: port.to.unwrap_or(host),
            });
        }
        // In one order, whatever the driver's: a restart asking the same ports finds
        // the namespace it had.
        forwarded.sort_by(|a, b| a.label.cmp(&b.label));
        Ok(forwarded)
    }

    /// What the task is given of `network`: its namespace, forwards and `/etc` files.
    fn given(&self, network: &GroupNetwork) -> Result<TaskNetwork, TaskNetworkRefusal> {
        let etc_files = match &self.etc_dir {
            Some(etc) => {
                let dir = etc.join(format!("task-{}", self.index));
                let files = super::etc_files::own_network_files(
                    &self.group,
                    &self.alloc_id,
                    network.address.as_deref(),
                )
                .map_err(|e| refusal(e.to_string()))?;
                super::etc_files::write_all(&dir, &files)
                    .map_err(|e| refusal(format!("writing its /etc files: {e}")))?;
                files.iter().map(|(name, _)| dir.join(name)).collect()
            }
            None => Vec::new(),
        };
        Ok(TaskNetwork {
            path: network.path.clone(),
            ports: network
                .forwarded
                .iter()
                .map(|p| (p.label.clone(), p.inside))
                .collect(),
            etc_files,
        })
    }

    fn save(&self, commit: Commit) {
        super::save_resources(&self.store, &self.alloc_id, &self.resources, commit);
    }
}

fn refusal(message: String) -> TaskNetworkRefusal {
    TaskNetworkRefusal(message)
}
