//! A scripted, recording stand-in for one CSI plugin (its node and controller services),
//! for the manager's unit tests. It stands for a plugin whose stages and publications
//! reach the host (bidirectional propagation): what it "mounts" it writes into a
//! [`FakeMounts`] table, which the manager reads as the host's mount table. It stands
//! for nothing about gRPC: the end-to-end tests keep the real plugin and client.
//!
//! Each call is recorded with its arguments, in order ([`Call`]), then answered as the
//! test scripted it for that RPC ([`Answer`], one per call, in order; [`Answer::Ok`] when
//! nothing is scripted). An answer stands for the whole call as the manager sees it, the
//! real client's retries included.

use std::collections::{BTreeMap, BTreeSet, HashMap, VecDeque};
use std::io;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use tonic::Code;

use super::client::{CreatedVolume, CsiError, NodeVolume};
use super::host_mounts::HostMounts;
use super::layout::PluginDirs;
use super::plugin::{CsiPlugin, PluginCall, PluginConnector};
use super::registry::PluginRegistration;
use berth_model::csi::{Capabilities, SnapshotInfo, Usage};

/// How the fake answers one call.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Answer {
    /// Does the work and answers OK.
    Ok,
    /// Answers OK and does nothing: a plugin whose mount does not reach the host, or
    /// one that unpublishes only what it recorded and leaves the bind.
    OkButNoEffect,
    /// Refuses with the code, having done nothing.
    Refuse(Code),
    /// Does the work, then the answer is lost: DEADLINE_EXCEEDED, an outcome unknown.
    LostAfterActing,
    /// Never answers and does nothing: the agent dies while the call is in flight.
    Hang,
    /// Does the work and never answers: the agent dies after the plugin acted, before
    /// it recorded the outcome.
    HangAfterActing,
}

/// One call the manager made, with the arguments the tests look at. Paths are the
/// plugin's (as it sees them), volumes the plugin's own ids.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Call {
    Probe,
    PluginInfo,
    PluginCapabilities,
    NodeInfo,
    NodeCapabilities,
    ControllerCapabilities,
    NodeStage {
        volume: String,
        staging: PathBuf,
    },
    NodeUnstage {
        volume: String,
        staging: PathBuf,
    },
    NodePublish {
        volume: String,
        staging: Option<PathBuf>,
        target: PathBuf,
    },
    NodeUnpublish {
        volume: String,
        target: PathBuf,
    },
    NodeExpand {
        volume: String,
        target: PathBuf,
        required: i64,
    },
    ControllerPublish {
        volume: String,
        node_id: String,
    },
    ControllerUnpublish {
        volume: String,
        node_id: String,
    },
    CreateVolume {
        name: String,
    },
    DeleteVolume {
        volume: String,
    },
    ControllerExpand {
        volume: String,
        required: i64,
    },
    CreateSnapshot {
        volume: String,
        name: String,
    },
    DeleteSnapshot {
        snapshot: String,
    },
    ListSnapshots,
}

impl Call {
    /// The RPC's name in the CSI spec, which scripts are keyed by.
    pub fn rpc(&self) -> &'static str {
        match self {
            Call::Probe => "Probe",
            Call::PluginInfo => "GetPluginInfo",
            Call::PluginCapabilities => "GetPluginCapabilities",
            Call::NodeInfo => "NodeGetInfo",
            Call::NodeCapabilities => "NodeGetCapabilities",
            Call::ControllerCapabilities => "ControllerGetCapabilities",
            Call::NodeStage { .. } => "NodeStageVolume",
            Call::NodeUnstage { .. } => "NodeUnstageVolume",
            Call::NodePublish { .. } => "NodePublishVolume",
            Call::NodeUnpublish { .. } => "NodeUnpublishVolume",
            Call::NodeExpand { .. } => "NodeExpandVolume",
            Call::ControllerPublish { .. } => "ControllerPublishVolume",
            Call::ControllerUnpublish { .. } => "ControllerUnpublishVolume",
            Call::CreateVolume { .. } => "CreateVolume",
            Call::DeleteVolume { .. } => "DeleteVolume",
            Call::ControllerExpand { .. } => "ControllerExpandVolume",
            Call::CreateSnapshot { .. } => "CreateSnapshot",
            Call::DeleteSnapshot { .. } => "DeleteSnapshot",
            Call::ListSnapshots => "ListSnapshots",
        }
    }

    /// Whether the call is part of fingerprinting (identity and capabilities), not an
    /// operation on a volume.
    pub fn is_fingerprint(&self) -> bool {
        matches!(
            self,
            Call::Probe
                | Call::PluginInfo
                | Call::PluginCapabilities
                | Call::NodeInfo
                | Call::NodeCapabilities
                | Call::ControllerCapabilities
        )
    }
}

/// The host's mount table as the fake plugin leaves it: the host paths it staged or
/// published at, and what the agent unmounted itself.
#[derive(Debug, Default)]
pub struct FakeMounts {
    mounted: Mutex<BTreeSet<PathBuf>>,
    unmounted_by_agent: Mutex<Vec<PathBuf>>,
}

impl FakeMounts {
    pub fn mount(&self, path: &Path) {
        self.mounted.lock().unwrap().insert(path.to_path_buf());
    }

    pub fn unmount(&self, path: &Path) {
        self.mounted.lock().unwrap().remove(path);
    }

    /// Forgets every mount, as a reboot of the host does.
    pub fn clear(&self) {
        self.mounted.lock().unwrap().clear();
    }

    pub fn mounted(&self) -> Vec<PathBuf> {
        self.mounted.lock().unwrap().iter().cloned().collect()
    }

    pub fn unmounted_by_agent(&self) -> Vec<PathBuf> {
        self.unmounted_by_agent.lock().unwrap().clone()
    }
}

impl HostMounts for FakeMounts {
    fn is_mount_point(&self, path: &Path) -> bool {
        self.mounted.lock().unwrap().contains(path)
    }

    fn unmount_all_below(&self, base: &Path, path: &Path) -> io::Result<usize> {
        if !path.starts_with(base) {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("{} is not below {}", path.display(), base.display()),
            ));
        }
        if !self.mounted.lock().unwrap().remove(path) {
            return Ok(0);
        }
        self.unmounted_by_agent
            .lock()
            .unwrap()
            .push(path.to_path_buf());
        Ok(1)
    }
}

/// What the fake says of itself when fingerprinted.
#[derive(Debug, Clone)]
pub struct FakeIdentity {
    pub name: String,
    pub node_id: String,
    /// The node and controller capabilities it reports.
    pub capabilities: Capabilities,
}

impl FakeIdentity {
    /// A node plugin that stages, with no controller.
    pub fn staging_node() -> FakeIdentity {
        FakeIdentity {
            name: "fake.csi.berth".into(),
            node_id: "fake-node".into(),
            capabilities: Capabilities {
                stage_unstage: true,
                ..Capabilities::default()
            },
        }
    }

    /// A plugin that stages and whose controller publishes to nodes.
    pub fn with_controller() -> FakeIdentity {
        let mut identity = FakeIdentity::staging_node();
        identity.capabilities.controller_service = true;
        identity.capabilities.controller_publish = true;
        identity
    }
}

pub struct FakeCsiPlugin {
    identity: FakeIdentity,
    /// Where the plugin's paths are on the host, to mount what it is asked to.
    dirs: PluginDirs,
    mounts: Arc<FakeMounts>,
    calls: Mutex<Vec<Call>>,
    script: Mutex<HashMap<&'static str, VecDeque<Answer>>>,
    /// (volume, node id) pairs its controller has published, as the storage keeps them.
    attached: Mutex<BTreeSet<(String, String)>>,
}

impl FakeCsiPlugin {
    pub fn new(identity: FakeIdentity, dirs: PluginDirs, mounts: Arc<FakeMounts>) -> Self {
        FakeCsiPlugin {
            identity,
            dirs,
            mounts,
            calls: Mutex::default(),
            script: Mutex::default(),
            attached: Mutex::default(),
        }
    }

    /// Answers the next calls of `rpc` (its CSI name, `NodeStageVolume`) so, in order.
    pub fn script(&self, rpc: &'static str, answers: impl IntoIterator<Item = Answer>) {
        self.script
            .lock()
            .unwrap()
            .entry(rpc)
            .or_default()
            .extend(answers);
    }

    /// Every call so far, in order.
    pub fn calls(&self) -> Vec<Call> {
        self.calls.lock().unwrap().clone()
    }

    /// The calls on volumes so far (fingerprinting left out), in order, and forgets them.
    pub fn take_volume_calls(&self) -> Vec<Call> {
        std::mem::take(&mut *self.calls.lock().unwrap())
            .into_iter()
            .filter(|call| !call.is_fingerprint())
            .collect()
    }

    /// Which volumes the controller has published to which nodes.
    pub fn attached(&self) -> Vec<(String, String)> {
        self.attached.lock().unwrap().iter().cloned().collect()
    }

    /// Records `call` and takes its scripted answer.
    fn answer(&self, call: Call) -> Answer {
        let rpc = call.rpc();
        self.calls.lock().unwrap().push(call);
        self.script
            .lock()
            .unwrap()
            .get_mut(rpc)
            .and_then(VecDeque::pop_front)
            .unwrap_or(Answer::Ok)
    }

    fn error(
        &self,
        rpc: &'static str,
        volume: Option<&str>,
        code: Code,
        message: &str,
    ) -> CsiError {
        CsiError {
            plugin: self.identity.name.clone(),
            rpc,
            volume: volume.map(str::to_string),
            code,
            message: message.to_string(),
            attempts: 1,
            socket: PathBuf::from("/fake/csi.sock"),
        }
    }

    /// Where a path the plugin was given is on the host; a path outside the plugin's
    /// tree is refused, as a plugin could not reach it.
    fn on_host(&self, rpc: &'static str, volume: &str, path: &Path) -> Result<PathBuf, CsiError> {
        path.strip_prefix(&self.dirs.plugin)
            .map(|relative| self.dirs.host.join(relative))
            .map_err(|_| {
                self.error(
                    rpc,
                    Some(volume),
                    Code::InvalidArgument,
                    &format!("{} is outside the plugin's tree", path.display()),
                )
            })
    }

    /// Runs the scripted answer for `rpc`: `effect` is the work, done or not as scripted.
    fn run<'a, T: Send + 'a>(
        &'a self,
        call: Call,
        volume: Option<String>,
        effect: impl FnOnce() -> Result<T, CsiError> + Send + 'a,
        nothing_done: T,
    ) -> PluginCall<'a, T> {
        let rpc = call.rpc();
        let answer = self.answer(call);
        Box::pin(async move {
            let volume = volume.as_deref();
            match answer {
                Answer::Ok => effect(),
                Answer::OkButNoEffect => Ok(nothing_done),
                Answer::Refuse(code) => Err(self.error(rpc, volume, code, "scripted refusal")),
                Answer::LostAfterActing => {
                    effect()?;
                    Err(self.error(rpc, volume, Code::DeadlineExceeded, "scripted lost answer"))
                }
                Answer::Hang => std::future::pending().await,
                Answer::HangAfterActing => {
                    let _ = effect();
                    std::future::pending().await
                }
            }
        })
    }

    /// A call that changes the host's mount table at the plugin path `path`.
    fn mount_call<'a>(
        &'a self,
        call: Call,
        volume: &str,
        path: &Path,
        mounted: bool,
    ) -> PluginCall<'a, ()> {
        let rpc = call.rpc();
        let host = self.on_host(rpc, volume, path);
        self.run(
            call,
            Some(volume.to_string()),
            move || {
                let host = host?;
                if mounted {
                    self.mounts.mount(&host);
                } else {
                    self.mounts.unmount(&host);
                }
                Ok(())
            },
            (),
        )
    }
}

/// Connects every registration to the one fake plugin.
pub struct FakeConnector(pub Arc<FakeCsiPlugin>);

impl PluginConnector for FakeConnector {
    fn connect(&self, _plugin: &PluginRegistration) -> Arc<dyn CsiPlugin> {
        self.0.clone()
    }
}

impl CsiPlugin for FakeCsiPlugin {
    fn probe(&self) -> PluginCall<'_, bool> {
        self.run(Call::Probe, None, || Ok(true), true)
    }

    fn plugin_info(&self) -> PluginCall<'_, (String, String)> {
        let info = (self.identity.name.clone(), "0.0.0".to_string());
        self.run(Call::PluginInfo, None, move || Ok(info), Default::default())
    }

    fn plugin_capabilities(&self) -> PluginCall<'_, bool> {
        let controller = self.identity.capabilities.controller_service;
        self.run(
            Call::PluginCapabilities,
            None,
            move || Ok(controller),
            false,
        )
    }

    fn node_info(&self) -> PluginCall<'_, (String, BTreeMap<String, String>)> {
        let info = (self.identity.node_id.clone(), BTreeMap::new());
        self.run(Call::NodeInfo, None, move || Ok(info), Default::default())
    }

    fn node_capabilities(&self) -> PluginCall<'_, (bool, bool)> {
        let c = &self.identity.capabilities;
        let answer = (c.stage_unstage, c.node_expand);
        self.run(
            Call::NodeCapabilities,
            None,
            move || Ok(answer),
            (false, false),
        )
    }

    fn controller_capabilities<'a>(
        &'a self,
        capabilities: &'a mut Capabilities,
    ) -> PluginCall<'a, ()> {
        let ours = self.identity.capabilities.clone();
        self.run(
            Call::ControllerCapabilities,
            None,
            move || {
                capabilities.controller_publish = ours.controller_publish;
                capabilities.create_delete = ours.create_delete;
                capabilities.snapshots = ours.snapshots;
                capabilities.list_snapshots = ours.list_snapshots;
                capabilities.controller_expand = ours.controller_expand;
                Ok(())
            },
            (),
        )
    }

    fn node_stage<'a>(
        &'a self,
        volume: &'a NodeVolume<'a>,
        staging_path: &'a Path,
    ) -> PluginCall<'a, ()> {
        let call = Call::NodeStage {
            volume: volume.external_id.to_string(),
            staging: staging_path.to_path_buf(),
        };
        self.mount_call(call, volume.external_id, staging_path, true)
    }

    fn node_unstage<'a>(
        &'a self,
        external_id: &'a str,
        staging_path: &'a Path,
    ) -> PluginCall<'a, ()> {
        let call = Call::NodeUnstage {
            volume: external_id.to_string(),
            staging: staging_path.to_path_buf(),
        };
        self.mount_call(call, external_id, staging_path, false)
    }

    fn node_publish<'a>(
        &'a self,
        volume: &'a NodeVolume<'a>,
        staging_path: Option<&'a Path>,
        target_path: &'a Path,
    ) -> PluginCall<'a, ()> {
        let call = Call::NodePublish {
            volume: volume.external_id.to_string(),
            staging: staging_path.map(Path::to_path_buf),
            target: target_path.to_path_buf(),
        };
        self.mount_call(call, volume.external_id, target_path, true)
    }

    fn node_unpublish<'a>(
        &'a self,
        external_id: &'a str,
        target_path: &'a Path,
    ) -> PluginCall<'a, ()> {
        let call = Call::NodeUnpublish {
            volume: external_id.to_string(),
            target: target_path.to_path_buf(),
        };
        self.mount_call(call, external_id, target_path, false)
    }

    fn node_expand<'a>(
        &'a self,
        external_id: &'a str,
        volume_path: &'a Path,
        _staging_path: Option<&'a Path>,
        required: i64,
        _usage: Usage,
    ) -> PluginCall<'a, i64> {
        let call = Call::NodeExpand {
            volume: external_id.to_string(),
            target: volume_path.to_path_buf(),
            required,
        };
        self.run(call, Some(external_id.to_string()), move || Ok(required), 0)
    }

    fn controller_publish<'a>(
        &'a self,
        volume: &'a NodeVolume<'a>,
        node_id: &'a str,
    ) -> PluginCall<'a, HashMap<String, String>> {
        let call = Call::ControllerPublish {
            volume: volume.external_id.to_string(),
            node_id: node_id.to_string(),
        };
        let attachment = (volume.external_id.to_string(), node_id.to_string());
        self.run(
            call,
            Some(volume.external_id.to_string()),
            move || {
                let context = HashMap::from([("attached-to".to_string(), attachment.1.clone())]);
                self.attached.lock().unwrap().insert(attachment);
                Ok(context)
            },
            HashMap::new(),
        )
    }

    fn controller_unpublish<'a>(
        &'a self,
        external_id: &'a str,
        node_id: &'a str,
        _secrets: &'a HashMap<String, String>,
    ) -> PluginCall<'a, ()> {
        let call = Call::ControllerUnpublish {
            volume: external_id.to_string(),
            node_id: node_id.to_string(),
        };
        let attachment = (external_id.to_string(), node_id.to_string());
        self.run(
            call,
            Some(external_id.to_string()),
            move || {
                self.attached.lock().unwrap().remove(&attachment);
                Ok(())
            },
            (),
        )
    }

    fn create_volume<'a>(
        &'a self,
        name: &'a str,
        capacity: (i64, i64),
        _usages: &'a [Usage],
        _parameters: &'a HashMap<String, String>,
        _secrets: &'a HashMap<String, String>,
    ) -> PluginCall<'a, CreatedVolume> {
        let created = CreatedVolume {
            external_id: format!("ext-{name}"),
            capacity_bytes: capacity.0,
            context: HashMap::new(),
            accessible_topology: Vec::new(),
        };
        let call = Call::CreateVolume {
            name: name.to_string(),
        };
        let nothing = created.clone();
        self.run(call, Some(name.to_string()), move || Ok(created), nothing)
    }

    fn delete_volume<'a>(
        &'a self,
        external_id: &'a str,
        _secrets: &'a HashMap<String, String>,
    ) -> PluginCall<'a, ()> {
        let call = Call::DeleteVolume {
            volume: external_id.to_string(),
        };
        self.run(call, Some(external_id.to_string()), || Ok(()), ())
    }

    fn controller_expand<'a>(
        &'a self,
        external_id: &'a str,
        required: i64,
        _usage: Usage,
        _secrets: &'a HashMap<String, String>,
    ) -> PluginCall<'a, (i64, bool)> {
        let call = Call::ControllerExpand {
            volume: external_id.to_string(),
            required,
        };
        let node_expand = self.identity.capabilities.node_expand;
        let answer = (required, node_expand);
        self.run(
            call,
            Some(external_id.to_string()),
            move || Ok(answer),
            answer,
        )
    }

    fn create_snapshot<'a>(
        &'a self,
        source: &'a str,
        name: &'a str,
        _secrets: &'a HashMap<String, String>,
    ) -> PluginCall<'a, SnapshotInfo> {
        let snapshot = SnapshotInfo {
            plugin_id: self.identity.name.clone(),
            snapshot_id: format!("snap-{name}"),
            source_volume_id: source.to_string(),
            size_bytes: 0,
            created_at: 0,
            ready_to_use: true,
        };
        let call = Call::CreateSnapshot {
            volume: source.to_string(),
            name: name.to_string(),
        };
        let nothing = snapshot.clone();
        self.run(
            call,
            Some(source.to_string()),
            move || Ok(snapshot),
            nothing,
        )
    }

    fn delete_snapshot<'a>(
        &'a self,
        snapshot_id: &'a str,
        _secrets: &'a HashMap<String, String>,
    ) -> PluginCall<'a, ()> {
        let call = Call::DeleteSnapshot {
            snapshot: snapshot_id.to_string(),
        };
        self.run(call, None, || Ok(()), ())
    }

    fn list_snapshots(&self) -> PluginCall<'_, Vec<SnapshotInfo>> {
        self.run(Call::ListSnapshots, None, || Ok(Vec::new()), Vec::new())
    }
}
