//! Data alloc hooks produce for task hooks (CSI mounts, the group's network): one object
//! per alloc, shared by every task runner, read and written only through methods that
//! hold its lock and return copies.
//!
//! It is created with the alloc runner, before any hook runs (also when an alloc is
//! restored), so a task hook never finds it missing (Nomad's #16623).

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Mutex;

use serde::{Deserialize, Serialize};

/// A volume an alloc hook mounted on the host, ready to be bound into tasks.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct MountedVolume {
    pub host_path: PathBuf,
    pub read_only: bool,
}

#[derive(Debug, Default)]
pub struct HookResources {
    inner: Mutex<Inner>,
    /// Held from a snapshot to the end of its write ([`HookResources::persist`]): two
    /// writers (task runners making their own networks) never put an older snapshot
    /// over a newer one.
    persisting: Mutex<()>,
}

/// A group's own network (bridge mode), or an image task's (Docker's default bridge in a
/// host-mode group): its namespace, and what attaching it made.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct GroupNetwork {
    /// The namespace's name (`/run/netns/<name>`): the alloc's id (a task's: the alloc's
    /// id and the task's place in the group).
    pub namespace: String,
    pub path: PathBuf,
    /// The alloc's (or the task's) address on the bridge, once attached.
    #[serde(default)]
    pub address: Option<String>,
    /// The CNI ADD's result, which its DEL is given; `None` until the ADD succeeded.
    #[serde(default)]
    pub attached: Option<serde_json::Value>,
    /// The bridge network it is attached to (its name and subnet when attached): the DEL
    /// goes to the same network even if the operator renamed it since.
    #[serde(default)]
    pub bridge: Option<(String, String)>,
    /// A task's network: the group ports forwarded to it (the group's forwards are its
    /// ports').
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub forwarded: Vec<ForwardedPort>,
}

/// A group port forwarded from the host to a task's own network.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ForwardedPort {
    pub label: String,
    pub host: u16,
    pub inside: u16,
}

#[derive(Debug, Default, Clone, Serialize, Deserialize)]
struct Inner {
    csi_mounts: BTreeMap<String, MountedVolume>,
    #[serde(default)]
    network: Option<GroupNetwork>,
    /// Image tasks' own networks (Docker's default bridge, in a host-mode group), by
    /// task name.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    task_networks: BTreeMap<String, GroupNetwork>,
}

impl HookResources {
    /// Replaces the CSI mounts (by group volume name) in one step, so readers see either
    /// the old set or the new one, never a mix.
    pub fn set_csi_mounts(&self, mounts: BTreeMap<String, MountedVolume>) {
        self.inner.lock().unwrap().csi_mounts = mounts;
    }

    pub fn csi_mounts(&self) -> BTreeMap<String, MountedVolume> {
        self.inner.lock().unwrap().csi_mounts.clone()
    }

    pub fn csi_mount(&self, volume: &str) -> Option<MountedVolume> {
        self.inner.lock().unwrap().csi_mounts.get(volume).cloned()
    }

    pub fn set_network(&self, network: Option<GroupNetwork>) {
        self.inner.lock().unwrap().network = network;
    }

    pub fn network(&self) -> Option<GroupNetwork> {
        self.inner.lock().unwrap().network.clone()
    }

    /// Sets (or with `None` forgets) task `task`'s own network.
    pub fn set_task_network(&self, task: &str, network: Option<GroupNetwork>) {
        let mut inner = self.inner.lock().unwrap();
        match network {
            Some(network) => inner.task_networks.insert(task.to_string(), network),
            None => inner.task_networks.remove(task),
        };
    }

    /// The image tasks' own networks, by task name.
    pub fn task_networks(&self) -> BTreeMap<String, GroupNetwork> {
        self.inner.lock().unwrap().task_networks.clone()
    }

    /// Writes everything with `write`, one writer at a time, each with a snapshot
    /// taken once the writer before it is done.
    pub fn persist<E>(&self, write: impl FnOnce(&[u8]) -> Result<(), E>) -> Result<(), E> {
        let _turn = self.persisting.lock().unwrap_or_else(|p| p.into_inner());
        write(&self.to_bytes())
    }

    /// Everything, as bytes for the state store.
    pub fn to_bytes(&self) -> Vec<u8> {
        let inner = self.inner.lock().unwrap().clone();
        serde_json::to_vec(&inner).expect("hook resources always serialise")
    }

    /// Resources as recorded before an agent restart.
    pub fn from_bytes(bytes: &[u8]) -> Result<HookResources, UnreadableResources> {
        Ok(HookResources {
            inner: Mutex::new(
                serde_json::from_slice(bytes).map_err(|e| UnreadableResources(e.to_string()))?,
            ),
            persisting: Mutex::new(()),
        })
    }
}

/// Recorded hook resources that do not parse (a state file from another version, or a
/// damaged one).
#[derive(Debug, thiserror::Error)]
#[error("recorded hook resources do not parse: {0}")]
pub struct UnreadableResources(String);

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;
    use std::sync::{Arc, Barrier};

    use super::*;

    /// Many task runners read while an alloc hook keeps replacing the mounts: every read
    /// sees one whole generation, never a mix of two, and generations only move forward.
    /// The readers start together with the writer and the test checks that they did
    /// overlap, so it cannot pass by reading before or after all the writes.
    #[test]
    fn readers_never_see_a_torn_update() {
        const WRITES: u32 = 2_000;
        let resources = Arc::new(HookResources::default());
        let generation = |n: u32| -> BTreeMap<String, MountedVolume> {
            (0..8)
                .map(|v| {
                    let mount = MountedVolume {
                        host_path: format!("/gen/{n}/{v}").into(),
                        read_only: false,
                    };
                    (format!("vol{v}"), mount)
                })
                .collect()
        };
        let generation_of = |mount: &MountedVolume| -> u32 {
            let text = mount.host_path.to_string_lossy();
            text.split('/').nth(2).unwrap().parse().unwrap()
        };
        resources.set_csi_mounts(generation(0));
        let start = Arc::new(Barrier::new(9));
        // The newest generation any reader saw: the writer lets the readers catch up
        // now and then, so reads and writes overlap even on a busy two-core machine,
        // where the writer could otherwise be done before a reader ran.
        let observed = Arc::new(std::sync::atomic::AtomicU32::new(0));
        let writer = {
            let (resources, start, observed) = (resources.clone(), start.clone(), observed.clone());
            std::thread::spawn(move || {
                start.wait();
                for n in 1..=WRITES {
                    resources.set_csi_mounts(generation(n));
                    let mut patience = 100_000;
                    while observed.load(std::sync::atomic::Ordering::SeqCst) < n && patience > 0 {
                        std::thread::yield_now();
                        patience -= 1;
                    }
                }
            })
        };
        let readers: Vec<_> = (0..8)
            .map(|_| {
                let (resources, start, observed) =
                    (resources.clone(), start.clone(), observed.clone());
                std::thread::spawn(move || {
                    start.wait();
                    let mut seen = BTreeSet::new();
                    let mut last = 0;
                    loop {
                        let mounts = resources.csi_mounts();
                        let generations: BTreeSet<u32> =
                            mounts.values().map(generation_of).collect();
                        assert_eq!(mounts.len(), 8, "torn read: {mounts:?}");
                        assert_eq!(generations.len(), 1, "torn read: {mounts:?}");
                        let current = *generations.first().unwrap();
                        assert!(current >= last, "went back from {last} to {current}");
                        last = current;
                        observed.fetch_max(current, std::sync::atomic::Ordering::SeqCst);
                        seen.insert(current);
                        if current == WRITES {
                            return seen.len();
                        }
                    }
                })
            })
            .collect();
        writer.join().unwrap();
        let distinct: Vec<usize> = readers.into_iter().map(|r| r.join().unwrap()).collect();
        // Reads and writes overlapped: some reader saw a generation strictly between the
        // first and the last.
        assert!(
            distinct.iter().any(|&n| n > 2),
            "no reader overlapped the writer: {distinct:?}"
        );
        assert_eq!(
            resources.csi_mount("vol3").unwrap().host_path,
            std::path::PathBuf::from(format!("/gen/{WRITES}/3"))
        );
    }
}
