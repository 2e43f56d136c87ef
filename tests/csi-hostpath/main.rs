//! csi-hostpath: berth's reference CSI plugin. Volumes are directories under a data
//! directory; staging bind-mounts a volume's directory at the staging path, publishing
//! bind-mounts the staging path at the target. It runs as a berth task (a `csi_plugin`
//! block) and is strict to the CSI spec, so it also checks the agent's side of it:
//!
//! - ControllerPublishVolume returns a publish context that NodeStageVolume requires;
//! - publishing an unstaged volume is FAILED_PRECONDITION; an unknown volume NOT_FOUND;
//!   re-publishing at a target with other settings ALREADY_EXISTS;
//! - a volume has one staging_target_path per node: staging it at a second path while it
//!   is staged at a first is ALREADY_EXISTS (kept in `<data-dir>/.staged/`, so a
//!   restarted plugin still refuses);
//! - unpublish and unstage unmount and remove what the plugin created;
//! - snapshots are copies of a volume's directory under `<data-dir>/.snapshots/<name>`
//!   (the name is the id: the same name of another volume is ALREADY_EXISTS);
//!   expansion records the capacity in `<data-dir>/.capacity/<volume>`, refuses to
//!   shrink (OUT_OF_RANGE), and asks the node to follow, which wants a published path;
//! - a volume still published (kept in `<data-dir>/.published/`) is not unstaged, and a
//!   volume still staged on a node is not controller-unpublished from it; a single-node
//!   volume published to one node (`<data-dir>/.attached/`) is not published to another:
//!   FAILED_PRECONDITION, and a `SPEC VIOLATION` line in the log. Stages and
//!   publications are recorded per node id: nodes may share the data dir, as a network
//!   storage's are shared.
//!
//! A file `<data-dir>/.lost-<node id>` says that node is gone (its machine is off): its
//! stages are stale, and the controller unpublishes from it though they remain.
//!
//! Every RPC is logged on stdout, one line each, so tests can count them.
//!
//! A file `<data-dir>/.not-ready-<node id>` makes the plugin of that node id answer
//! Probe with not ready while the file exists.
//!
//! A file `<data-dir>/.keep-failed-bind` makes NodePublishVolume bind, then fail as a
//! real plugin whose remount was refused does, leaving the bind mounted; and
//! NodeUnpublishVolume then answers success for a target it never recorded as
//! published, without unmounting it.
//!
//! For crash tests, a file `<data-dir>/.pause-after` naming an RPC makes the plugin, once
//! that RPC has done its work and before it answers, replace the file with
//! `<data-dir>/.paused` and wait until that is removed: the agent waits for an answer
//! the test can kill it before it gets. `RPC always` pauses every such call, so the
//! agent's deadline passes after the plugin acted.
//!
//! ```text
//! csi-hostpath --data-dir DIR [--node-id ID] [--endpoint unix:///csi/csi.sock]
//!              [--hang RPC] [--die RPC] [--not-ready-for SECS] [--garbage] [--no-socket]
//!              [--no-snapshots] [--topology KEY=VALUE] [--reaches NODE_ID]...
//! ```
//! The endpoint defaults to `$CSI_ENDPOINT`. `--hang`, `--die`, `--garbage`,
//! `--no-socket` and `--not-ready-for` make it misbehave, for the agent's tests.

use std::collections::HashMap;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use berth_proto::csi as pb;
use tonic::{Request, Response, Status};

#[derive(Clone)]
struct Plugin {
    data_dir: PathBuf,
    node_id: String,
    hang: Option<String>,
    die: Option<String>,
    ready_at: Instant,
    snapshots: bool,
    /// Where this node is (NodeGetInfo); the volumes it creates are accessible there.
    topology: HashMap<String, String>,
    /// Other nodes this plugin's storage reaches (`--reaches`): its controller publishes
    /// to them as to its own node, as a network storage's controller would.
    reaches: Vec<String>,
}

const PUBLISHED_KEY: &str = "hostpath.berth/published-to";

fn log(line: String) {
    let mut out = std::io::stdout().lock();
    let _ = writeln!(out, "{line}");
    let _ = out.flush();
}

impl Plugin {
    /// Logs the call and misbehaves if asked to.
    async fn enter(&self, rpc: &str, detail: String) {
        log(format!("{rpc} {detail}"));
        if self.die.as_deref() == Some(rpc) {
            log(format!("dying in {rpc}, as asked"));
            std::process::exit(3);
        }
        if self.hang.as_deref() == Some(rpc) {
            log(format!("hanging in {rpc}, as asked"));
            std::future::pending::<()>().await;
        }
    }

    /// Called when an RPC has done its work, before it answers: pauses there if a crash
    /// test asked for it.
    async fn leave(&self, rpc: &str) {
        let armed = self.data_dir.join(".pause-after");
        let Ok(wanted) = std::fs::read_to_string(&armed) else {
            return;
        };
        let mut words = wanted.split_whitespace();
        if words.next() == Some(rpc) {
            let paused = self.data_dir.join(".paused");
            let _ = std::fs::write(&paused, rpc);
            if words.next() != Some("always") {
                let _ = std::fs::remove_file(&armed);
            }
            log(format!("paused after {rpc}, as asked"));
            let deadline = Instant::now() + Duration::from_secs(60);
            while paused.exists() && Instant::now() < deadline {
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        }
    }

    /// Refuses what the CSI spec forbids the CO to do, saying so in the log.
    fn violation(&self, rule: String) -> Status {
        log(format!("SPEC VIOLATION by the CO: {rule}"));
        Status::failed_precondition(rule)
    }

    /// A record of `volume` for `node`: `<data_dir>/<kind>/<volume>/<node>`. Records are
    /// per node because nodes share the data dir, as a network storage's would be.
    fn record_file(&self, kind: &str, volume: &str, node: &str) -> PathBuf {
        self.data_dir.join(kind).join(volume).join(node)
    }

    /// Writes (`Some`) or removes (`None`) a record; a volume's dir goes with its last.
    fn write_record(
        &self,
        kind: &str,
        volume: &str,
        node: &str,
        text: Option<&[u8]>,
    ) -> Result<(), Status> {
        let file = self.record_file(kind, volume, node);
        let Some(dir) = file.parent() else {
            return Err(Status::internal(format!("no dir for {}", file.display())));
        };
        let result = match text {
            Some(text) => std::fs::create_dir_all(dir).and_then(|()| std::fs::write(&file, text)),
            None => match std::fs::remove_file(&file) {
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
                other => other.map(|()| {
                    let _ = std::fs::remove_dir(dir);
                }),
            },
        };
        result.map_err(|e| Status::internal(format!("recording {kind} of {volume:?}: {e}")))
    }

    /// The targets a volume is published at on this node, kept in the data dir like its
    /// stage.
    fn published_at(&self, volume: &str) -> Vec<PathBuf> {
        std::fs::read_to_string(self.record_file(".published", volume, &self.node_id))
            .unwrap_or_default()
            .lines()
            .filter(|l| !l.is_empty())
            .map(PathBuf::from)
            .collect()
    }

    fn record_publication(
        &self,
        volume: &str,
        target: &Path,
        published: bool,
    ) -> Result<(), Status> {
        let mut targets = self.published_at(volume);
        targets.retain(|t| t != target);
        if published {
            targets.push(target.to_path_buf());
        }
        let text: Vec<String> = targets.iter().map(|t| t.display().to_string()).collect();
        let text = text.join("\n");
        let text = (!targets.is_empty()).then_some(text.as_bytes());
        self.write_record(".published", volume, &self.node_id, text)
    }

    /// Where a volume is staged on `node`, kept in the data dir so that a restarted
    /// plugin still knows: `<data_dir>/.staged/<volume>/<node>` holds the staging path.
    fn staged_at(&self, volume: &str, node: &str) -> Option<PathBuf> {
        std::fs::read_to_string(self.record_file(".staged", volume, node))
            .ok()
            .map(PathBuf::from)
    }

    fn record_stage(&self, volume: &str, at: Option<&Path>) -> Result<(), Status> {
        let text = at.map(|at| at.as_os_str().as_encoded_bytes());
        self.write_record(".staged", volume, &self.node_id, text)
    }

    /// The nodes the controller published `volume` to: `<data_dir>/.attached/<volume>/`.
    fn attached_to(&self, volume: &str) -> Vec<String> {
        std::fs::read_dir(self.data_dir.join(".attached").join(volume))
            .into_iter()
            .flatten()
            .flatten()
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .collect()
    }

    fn volume_dir(&self, id: &str) -> Result<PathBuf, Status> {
        if id.is_empty() {
            return Err(Status::invalid_argument("volume_id is required"));
        }
        if id.contains('/') || id == "." || id == ".." {
            return Err(Status::not_found(format!("no volume {id:?}")));
        }
        let dir = self.data_dir.join(id);
        if dir.is_dir() {
            Ok(dir)
        } else {
            Err(Status::not_found(format!(
                "no volume {id:?} in {}",
                self.data_dir.display()
            )))
        }
    }
}

fn require_path(name: &str, path: &str) -> Result<PathBuf, Status> {
    if path.is_empty() || !path.starts_with('/') {
        return Err(Status::invalid_argument(format!(
            "{name} must be an absolute path, got {path:?}"
        )));
    }
    Ok(PathBuf::from(path))
}

fn require_capability(
    capability: &Option<pb::VolumeCapability>,
) -> Result<&pb::VolumeCapability, Status> {
    use pb::volume_capability::AccessType;
    let capability = capability
        .as_ref()
        .ok_or_else(|| Status::invalid_argument("volume_capability is required"))?;
    match capability.access_type {
        Some(AccessType::Mount(_)) => Ok(capability),
        Some(AccessType::Block(_)) => Err(Status::invalid_argument(
            "hostpath volumes are file systems, not block devices",
        )),
        None => Err(Status::invalid_argument(
            "volume_capability.access_type is required",
        )),
    }
}

/// The mount at `path`, if `path` is a mount point: (device:root, read-only).
fn mount_at(path: &Path) -> Option<(String, bool)> {
    let text = std::fs::read_to_string("/proc/self/mountinfo").ok()?;
    let wanted = path.to_str()?;
    text.lines().rev().find_map(|line| {
        let fields: Vec<&str> = line.split(' ').collect();
        (fields.get(4) == Some(&wanted)).then(|| {
            let source = format!("{}:{}", fields[2], fields[3]);
            let read_only = fields[5].split(',').any(|o| o == "ro");
            (source, read_only)
        })
    })
}

/// The file whose presence makes NodePublishVolume fail after its bind, keeping it.
const KEEP_FAILED_BIND: &str = ".keep-failed-bind";

/// Binds `source` at `target` as real plugins do (Kubernetes' mount-utils, the hostpath
/// driver): mount(8) twice, `mount -o bind SRC TARGET`, then `mount -o
/// bind,remount[,ro] SRC TARGET` for the access mode. In a granted plugin task berth's
/// mount warden makes both for the plugin. A bind whose remount fails is undone, so a
/// failed publish leaves nothing mounted.
fn bind(source: &Path, target: &Path, read_only: bool) -> Result<(), Status> {
    mount_command(&["-o", "bind"], source, target)?;
    let remount = if read_only {
        "bind,remount,ro"
    } else {
        "bind,remount,rw"
    };
    if let Err(status) = mount_command(&["-o", remount], source, target) {
        let _ = unmount(target);
        return Err(status);
    }
    Ok(())
}

/// `mount <options> SOURCE TARGET`, its stderr in the error.
fn mount_command(options: &[&str], source: &Path, target: &Path) -> Result<(), Status> {
    let output = std::process::Command::new("mount")
        .args(options)
        .arg(source)
        .arg(target)
        .output()
        .map_err(|e| Status::internal(format!("running mount(8): {e}")))?;
    if output.status.success() {
        return Ok(());
    }
    Err(Status::internal(format!(
        "mount {} {} {}: {}",
        options.join(" "),
        source.display(),
        target.display(),
        String::from_utf8_lossy(&output.stderr).trim()
    )))
}

/// `umount TARGET`, as real plugins unmount.
fn unmount(target: &Path) -> Result<(), Status> {
    let output = std::process::Command::new("umount")
        .arg(target)
        .output()
        .map_err(|e| Status::internal(format!("running umount(8): {e}")))?;
    if output.status.success() {
        return Ok(());
    }
    Err(Status::internal(format!(
        "umount {}: {}",
        target.display(),
        String::from_utf8_lossy(&output.stderr).trim()
    )))
}

#[tonic::async_trait]
impl pb::identity_server::Identity for Plugin {
    async fn get_plugin_info(
        &self,
        _: Request<pb::GetPluginInfoRequest>,
    ) -> Result<Response<pb::GetPluginInfoResponse>, Status> {
        self.enter("GetPluginInfo", String::new()).await;
        Ok(Response::new(pb::GetPluginInfoResponse {
            name: "hostpath.csi.berth.dev".into(),
            vendor_version: env!("CARGO_PKG_VERSION").into(),
            manifest: HashMap::new(),
        }))
    }

    async fn get_plugin_capabilities(
        &self,
        _: Request<pb::GetPluginCapabilitiesRequest>,
    ) -> Result<Response<pb::GetPluginCapabilitiesResponse>, Status> {
        use pb::plugin_capability::{Service, Type, service};
        self.enter("GetPluginCapabilities", String::new()).await;
        Ok(Response::new(pb::GetPluginCapabilitiesResponse {
            capabilities: vec![pb::PluginCapability {
                r#type: Some(Type::Service(Service {
                    r#type: service::Type::ControllerService as i32,
                })),
            }],
        }))
    }

    async fn probe(
        &self,
        _: Request<pb::ProbeRequest>,
    ) -> Result<Response<pb::ProbeResponse>, Status> {
        // Probes are frequent; not logged.
        if self.hang.as_deref() == Some("Probe") {
            std::future::pending::<()>().await;
        }
        // A file `<data-dir>/.not-ready-<node id>` makes this node's plugin say it is not
        // ready while it exists (a plugin turning unhealthy while it runs).
        let held = self
            .data_dir
            .join(format!(".not-ready-{}", self.node_id))
            .exists();
        let ready = Instant::now() >= self.ready_at && !held;
        // Unset means ready: say so the short way when ready.
        Ok(Response::new(pb::ProbeResponse {
            ready: (!ready).then_some(false),
        }))
    }
}

#[tonic::async_trait]
impl pb::controller_server::Controller for Plugin {
    async fn create_volume(
        &self,
        request: Request<pb::CreateVolumeRequest>,
    ) -> Result<Response<pb::CreateVolumeResponse>, Status> {
        let request = request.into_inner();
        self.enter("CreateVolume", format!("name={}", request.name))
            .await;
        if request.name.is_empty() || request.name.contains('/') || request.name.starts_with('.') {
            return Err(Status::invalid_argument(format!(
                "unusable volume name {:?}",
                request.name
            )));
        }
        if request.volume_capabilities.is_empty() {
            return Err(Status::invalid_argument("volume_capabilities is required"));
        }
        for capability in &request.volume_capabilities {
            require_capability(&Some(capability.clone()))?;
        }
        let dir = self.data_dir.join(&request.name);
        // Writable by the tasks that mount it, whatever their user (exec tasks run as
        // nobody unless their job says otherwise).
        std::fs::create_dir_all(&dir)
            .and_then(|()| {
                std::fs::set_permissions(&dir, std::os::unix::fs::PermissionsExt::from_mode(0o1777))
            })
            .map_err(|e| Status::internal(format!("creating {}: {e}", dir.display())))?;
        let capacity = request
            .capacity_range
            .map(|c| c.required_bytes)
            .unwrap_or(0);
        let accessible_topology = if self.topology.is_empty() {
            Vec::new()
        } else {
            vec![pb::Topology {
                segments: self.topology.clone(),
            }]
        };
        Ok(Response::new(pb::CreateVolumeResponse {
            volume: Some(pb::Volume {
                capacity_bytes: capacity,
                volume_id: request.name.clone(),
                accessible_topology,
                volume_context: HashMap::from([(
                    "hostpath.berth/dir".to_string(),
                    dir.display().to_string(),
                )]),
                ..Default::default()
            }),
        }))
    }

    async fn delete_volume(
        &self,
        request: Request<pb::DeleteVolumeRequest>,
    ) -> Result<Response<pb::DeleteVolumeResponse>, Status> {
        let request = request.into_inner();
        self.enter("DeleteVolume", format!("volume={}", request.volume_id))
            .await;
        match self.volume_dir(&request.volume_id) {
            Ok(dir) => std::fs::remove_dir_all(&dir)
                .map_err(|e| Status::internal(format!("removing {}: {e}", dir.display())))?,
            // Deleting what is not there is success.
            Err(status) if status.code() == tonic::Code::NotFound => {}
            Err(status) => return Err(status),
        }
        Ok(Response::new(pb::DeleteVolumeResponse {}))
    }

    async fn controller_publish_volume(
        &self,
        request: Request<pb::ControllerPublishVolumeRequest>,
    ) -> Result<Response<pb::ControllerPublishVolumeResponse>, Status> {
        let request = request.into_inner();
        self.enter(
            "ControllerPublishVolume",
            format!("volume={} node={}", request.volume_id, request.node_id),
        )
        .await;
        self.volume_dir(&request.volume_id)?;
        let capability = require_capability(&request.volume_capability)?;
        if request.node_id != self.node_id && !self.reaches.contains(&request.node_id) {
            return Err(Status::not_found(format!(
                "no node {:?} (this plugin serves {:?} and {:?})",
                request.node_id, self.node_id, self.reaches
            )));
        }
        // CSI spec, ControllerPublishVolume: a volume without a MULTI_NODE capability
        // published at another node is FAILED_PRECONDITION, naming that node.
        let single_node = capability
            .access_mode
            .as_ref()
            .is_some_and(|m| [1, 2, 6, 7].contains(&m.mode));
        if let Some(other) = self
            .attached_to(&request.volume_id)
            .into_iter()
            .find(|n| *n != request.node_id)
            .filter(|_| single_node)
        {
            return Err(self.violation(format!(
                "volume {:?} is published at node {other:?} and is single-node: \
                 ControllerUnpublishVolume from there comes before a ControllerPublishVolume \
                 to node {:?}",
                request.volume_id, request.node_id
            )));
        }
        self.write_record(".attached", &request.volume_id, &request.node_id, Some(b""))?;
        self.leave("ControllerPublishVolume").await;
        Ok(Response::new(pb::ControllerPublishVolumeResponse {
            publish_context: HashMap::from([(PUBLISHED_KEY.to_string(), request.node_id)]),
        }))
    }

    async fn controller_unpublish_volume(
        &self,
        request: Request<pb::ControllerUnpublishVolumeRequest>,
    ) -> Result<Response<pb::ControllerUnpublishVolumeResponse>, Status> {
        let request = request.into_inner();
        self.enter(
            "ControllerUnpublishVolume",
            format!("volume={} node={}", request.volume_id, request.node_id),
        )
        .await;
        self.volume_dir(&request.volume_id)?;
        // CSI spec, ControllerUnpublishVolume: called after all NodeUnstageVolume and
        // NodeUnpublishVolume calls for the volume have succeeded. A node that is gone
        // (the test says so with `.lost-<node id>`) cannot unstage: its stage is stale.
        let lost = self
            .data_dir
            .join(format!(".lost-{}", request.node_id))
            .exists();
        if let Some(staging) = self
            .staged_at(&request.volume_id, &request.node_id)
            .filter(|_| !lost)
        {
            return Err(self.violation(format!(
                "volume {:?} is still staged at {} on node {:?}: NodeUnstageVolume comes \
                 before ControllerUnpublishVolume",
                request.volume_id,
                staging.display(),
                request.node_id
            )));
        }
        self.write_record(".attached", &request.volume_id, &request.node_id, None)?;
        self.leave("ControllerUnpublishVolume").await;
        Ok(Response::new(pb::ControllerUnpublishVolumeResponse {}))
    }

    async fn validate_volume_capabilities(
        &self,
        request: Request<pb::ValidateVolumeCapabilitiesRequest>,
    ) -> Result<Response<pb::ValidateVolumeCapabilitiesResponse>, Status> {
        let request = request.into_inner();
        self.enter(
            "ValidateVolumeCapabilities",
            format!("volume={}", request.volume_id),
        )
        .await;
        self.volume_dir(&request.volume_id)?;
        for capability in &request.volume_capabilities {
            require_capability(&Some(capability.clone()))?;
        }
        Ok(Response::new(pb::ValidateVolumeCapabilitiesResponse {
            confirmed: Some(pb::validate_volume_capabilities_response::Confirmed {
                volume_context: request.volume_context,
                volume_capabilities: request.volume_capabilities,
                parameters: request.parameters,
                mutable_parameters: HashMap::new(),
            }),
            message: String::new(),
        }))
    }

    async fn controller_get_capabilities(
        &self,
        _: Request<pb::ControllerGetCapabilitiesRequest>,
    ) -> Result<Response<pb::ControllerGetCapabilitiesResponse>, Status> {
        use pb::controller_service_capability::{Rpc, Type, rpc};
        self.enter("ControllerGetCapabilities", String::new()).await;
        let rpc = |t: rpc::Type| pb::ControllerServiceCapability {
            r#type: Some(Type::Rpc(Rpc { r#type: t as i32 })),
        };
        let mut capabilities = vec![
            rpc(rpc::Type::CreateDeleteVolume),
            rpc(rpc::Type::PublishUnpublishVolume),
            rpc(rpc::Type::ExpandVolume),
        ];
        if self.snapshots {
            capabilities.push(rpc(rpc::Type::CreateDeleteSnapshot));
            capabilities.push(rpc(rpc::Type::ListSnapshots));
        }
        Ok(Response::new(pb::ControllerGetCapabilitiesResponse {
            capabilities,
        }))
    }

    async fn create_snapshot(
        &self,
        request: Request<pb::CreateSnapshotRequest>,
    ) -> Result<Response<pb::CreateSnapshotResponse>, Status> {
        let request = request.into_inner();
        self.enter(
            "CreateSnapshot",
            format!("volume={} name={}", request.source_volume_id, request.name),
        )
        .await;
        if !self.snapshots {
            return Err(Status::unimplemented("snapshots are off (--no-snapshots)"));
        }
        let source = self.volume_dir(&request.source_volume_id)?;
        let name = &request.name;
        if name.is_empty() || name.contains('/') || name.starts_with('.') {
            return Err(Status::invalid_argument(format!(
                "unusable snapshot name {name:?}"
            )));
        }
        let snapshots = self.data_dir.join(".snapshots");
        let dir = snapshots.join(name);
        let source_file = snapshots.join(format!("{name}.source"));
        match std::fs::read_to_string(&source_file) {
            // The same name again: the same snapshot, if of the same volume.
            Ok(of) if of == request.source_volume_id => {}
            Ok(of) => {
                return Err(Status::already_exists(format!(
                    "snapshot {name:?} exists, of volume {of:?}"
                )));
            }
            Err(_) => {
                copy_dir(&source, &dir)
                    .and_then(|()| std::fs::write(&source_file, &request.source_volume_id))
                    .map_err(|e| Status::internal(format!("copying {}: {e}", source.display())))?;
            }
        }
        Ok(Response::new(pb::CreateSnapshotResponse {
            snapshot: Some(self.snapshot(name)?),
        }))
    }

    async fn delete_snapshot(
        &self,
        request: Request<pb::DeleteSnapshotRequest>,
    ) -> Result<Response<pb::DeleteSnapshotResponse>, Status> {
        let request = request.into_inner();
        self.enter(
            "DeleteSnapshot",
            format!("snapshot={}", request.snapshot_id),
        )
        .await;
        let name = &request.snapshot_id;
        if name.is_empty() || name.contains('/') || name.starts_with('.') {
            return Err(Status::invalid_argument(format!(
                "unusable snapshot id {name:?}"
            )));
        }
        let snapshots = self.data_dir.join(".snapshots");
        // Deleting what is not there is success.
        let _ = std::fs::remove_dir_all(snapshots.join(name));
        let _ = std::fs::remove_file(snapshots.join(format!("{name}.source")));
        Ok(Response::new(pb::DeleteSnapshotResponse {}))
    }

    async fn list_snapshots(
        &self,
        _: Request<pb::ListSnapshotsRequest>,
    ) -> Result<Response<pb::ListSnapshotsResponse>, Status> {
        self.enter("ListSnapshots", String::new()).await;
        let mut entries = Vec::new();
        if let Ok(dir) = std::fs::read_dir(self.data_dir.join(".snapshots")) {
            for entry in dir.flatten() {
                let name = entry.file_name().to_string_lossy().into_owned();
                if let Some(name) = name.strip_suffix(".source") {
                    entries.push(pb::list_snapshots_response::Entry {
                        snapshot: Some(self.snapshot(name)?),
                    });
                }
            }
        }
        Ok(Response::new(pb::ListSnapshotsResponse {
            entries,
            next_token: String::new(),
        }))
    }

    async fn controller_expand_volume(
        &self,
        request: Request<pb::ControllerExpandVolumeRequest>,
    ) -> Result<Response<pb::ControllerExpandVolumeResponse>, Status> {
        let request = request.into_inner();
        let required = request.capacity_range.map_or(0, |r| r.required_bytes);
        self.enter(
            "ControllerExpandVolume",
            format!("volume={} required={required}", request.volume_id),
        )
        .await;
        self.volume_dir(&request.volume_id)?;
        let current = self.capacity(&request.volume_id);
        if required < current {
            return Err(Status::out_of_range(format!(
                "volume {:?} has {current} bytes; it is not shrunk to {required}",
                request.volume_id
            )));
        }
        let dir = self.data_dir.join(".capacity");
        std::fs::create_dir_all(&dir)
            .and_then(|()| std::fs::write(dir.join(&request.volume_id), required.to_string()))
            .map_err(|e| Status::internal(format!("recording the capacity: {e}")))?;
        Ok(Response::new(pb::ControllerExpandVolumeResponse {
            capacity_bytes: required,
            node_expansion_required: true,
        }))
    }
}

impl Plugin {
    /// A snapshot as the spec describes it, from what the data dir holds.
    fn snapshot(&self, name: &str) -> Result<pb::Snapshot, Status> {
        let snapshots = self.data_dir.join(".snapshots");
        let source = std::fs::read_to_string(snapshots.join(format!("{name}.source")))
            .map_err(|_| Status::not_found(format!("no snapshot {name:?}")))?;
        let created = std::fs::metadata(snapshots.join(name))
            .and_then(|m| m.modified())
            .ok()
            .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
            .unwrap_or_default();
        Ok(pb::Snapshot {
            size_bytes: dir_size(&snapshots.join(name)) as i64,
            snapshot_id: name.to_string(),
            source_volume_id: source,
            creation_time: Some(berth_proto::prost_types::Timestamp {
                seconds: created.as_secs() as i64,
                nanos: 0,
            }),
            ready_to_use: true,
            group_snapshot_id: String::new(),
        })
    }

    /// The capacity a volume was expanded to (0: never).
    fn capacity(&self, volume: &str) -> i64 {
        std::fs::read_to_string(self.data_dir.join(".capacity").join(volume))
            .ok()
            .and_then(|t| t.trim().parse().ok())
            .unwrap_or(0)
    }
}

/// Copies a directory tree of plain files and directories (a hostpath volume).
fn copy_dir(from: &Path, to: &Path) -> std::io::Result<()> {
    std::fs::create_dir_all(to)?;
    for entry in std::fs::read_dir(from)? {
        let entry = entry?;
        let kind = entry.file_type()?;
        let target = to.join(entry.file_name());
        if kind.is_dir() {
            copy_dir(&entry.path(), &target)?;
        } else if kind.is_file() {
            std::fs::copy(entry.path(), &target)?;
        }
    }
    Ok(())
}

fn dir_size(dir: &Path) -> u64 {
    std::fs::read_dir(dir)
        .map(|entries| {
            entries
                .flatten()
                .map(|e| match e.file_type() {
                    Ok(t) if t.is_dir() => dir_size(&e.path()),
                    _ => e.metadata().map(|m| m.len()).unwrap_or(0),
                })
                .sum()
        })
        .unwrap_or(0)
}

#[tonic::async_trait]
impl pb::node_server::Node for Plugin {
    async fn node_stage_volume(
        &self,
        request: Request<pb::NodeStageVolumeRequest>,
    ) -> Result<Response<pb::NodeStageVolumeResponse>, Status> {
        let request = request.into_inner();
        self.enter(
            "NodeStageVolume",
            format!(
                "volume={} staging={}",
                request.volume_id, request.staging_target_path
            ),
        )
        .await;
        let dir = self.volume_dir(&request.volume_id)?;
        let staging = require_path("staging_target_path", &request.staging_target_path)?;
        require_capability(&request.volume_capability)?;
        if request.publish_context.get(PUBLISHED_KEY) != Some(&self.node_id) {
            return Err(Status::failed_precondition(format!(
                "volume {:?} was not published to node {:?} by the controller (no {PUBLISHED_KEY} in the publish context)",
                request.volume_id, self.node_id
            )));
        }
        if !staging.is_dir() {
            return Err(Status::failed_precondition(format!(
                "the staging path {} does not exist: the CO creates it",
                staging.display()
            )));
        }
        // One staging_target_path per volume per node (CSI spec, NodeStageVolume): a
        // strict plugin refuses a second one, and so does this one.
        if let Some(other) = self
            .staged_at(&request.volume_id, &self.node_id)
            .filter(|p| *p != staging)
        {
            return Err(Status::already_exists(format!(
                "volume {:?} is already staged at {} on this node; a volume has one \
                 staging_target_path per node",
                request.volume_id,
                other.display()
            )));
        }
        let wanted = mount_at(&dir).map(|(source, _)| source);
        match mount_at(&staging) {
            // Staged already: fine if it is this volume.
            Some((source, _)) if Some(&source) == wanted.as_ref() || wanted.is_none() => {}
            Some(_) => {
                return Err(Status::already_exists(format!(
                    "another volume is staged at {}",
                    staging.display()
                )));
            }
            None => bind(&dir, &staging, false)?,
        }
        self.record_stage(&request.volume_id, Some(&staging))?;
        self.leave("NodeStageVolume").await;
        Ok(Response::new(pb::NodeStageVolumeResponse {}))
    }

    async fn node_unstage_volume(
        &self,
        request: Request<pb::NodeUnstageVolumeRequest>,
    ) -> Result<Response<pb::NodeUnstageVolumeResponse>, Status> {
        let request = request.into_inner();
        self.enter(
            "NodeUnstageVolume",
            format!(
                "volume={} staging={}",
                request.volume_id, request.staging_target_path
            ),
        )
        .await;
        self.volume_dir(&request.volume_id)?;
        let staging = require_path("staging_target_path", &request.staging_target_path)?;
        // CSI spec, NodeUnstageVolume: called after all NodeUnpublishVolume calls for the
        // volume have succeeded.
        if let Some(target) = self
            .published_at(&request.volume_id)
            .into_iter()
            .find(|t| mount_at(t).is_some())
        {
            return Err(self.violation(format!(
                "volume {:?} is still published at {}: NodeUnpublishVolume comes before \
                 NodeUnstageVolume",
                request.volume_id,
                target.display()
            )));
        }
        while mount_at(&staging).is_some() {
            unmount(&staging)?;
        }
        if self.staged_at(&request.volume_id, &self.node_id).as_deref() == Some(staging.as_path()) {
            self.record_stage(&request.volume_id, None)?;
        }
        self.leave("NodeUnstageVolume").await;
        Ok(Response::new(pb::NodeUnstageVolumeResponse {}))
    }

    async fn node_publish_volume(
        &self,
        request: Request<pb::NodePublishVolumeRequest>,
    ) -> Result<Response<pb::NodePublishVolumeResponse>, Status> {
        let request = request.into_inner();
        self.enter(
            "NodePublishVolume",
            format!(
                "volume={} target={} readonly={}",
                request.volume_id, request.target_path, request.readonly
            ),
        )
        .await;
        self.volume_dir(&request.volume_id)?;
        let staging = require_path("staging_target_path", &request.staging_target_path)?;
        let target = require_path("target_path", &request.target_path)?;
        require_capability(&request.volume_capability)?;
        if mount_at(&staging).is_none() {
            return Err(Status::failed_precondition(format!(
                "volume {:?} is not staged at {}: NodeStageVolume comes first",
                request.volume_id,
                staging.display()
            )));
        }
        let parent = target.parent().unwrap_or(Path::new("/"));
        if !parent.is_dir() {
            return Err(Status::failed_precondition(format!(
                "the target's parent {} does not exist: the CO creates it",
                parent.display()
            )));
        }
        if let Some((_, read_only)) = mount_at(&target) {
            if read_only == request.readonly {
                self.leave("NodePublishVolume").await;
                return Ok(Response::new(pb::NodePublishVolumeResponse {}));
            }
            return Err(Status::already_exists(format!(
                "{} is already published {}",
                target.display(),
                if read_only { "read-only" } else { "read-write" }
            )));
        }
        std::fs::create_dir_all(&target)
            .map_err(|e| Status::internal(format!("creating {}: {e}", target.display())))?;
        if self.data_dir.join(KEEP_FAILED_BIND).exists() {
            // As a real plugin whose remount was refused, answering with the refusal's
            // code (a code that says the plugin did nothing): the first bind stays.
            mount_command(&["-o", "bind"], &staging, &target)?;
            return Err(Status::permission_denied(format!(
                "mount -o bind,remount {}: permission denied (the bind stays)",
                target.display()
            )));
        }
        bind(&staging, &target, request.readonly)?;
        self.record_publication(&request.volume_id, &target, true)?;
        self.leave("NodePublishVolume").await;
        Ok(Response::new(pb::NodePublishVolumeResponse {}))
    }

    async fn node_unpublish_volume(
        &self,
        request: Request<pb::NodeUnpublishVolumeRequest>,
    ) -> Result<Response<pb::NodeUnpublishVolumeResponse>, Status> {
        let request = request.into_inner();
        self.enter(
            "NodeUnpublishVolume",
            format!(
                "volume={} target={}",
                request.volume_id, request.target_path
            ),
        )
        .await;
        self.volume_dir(&request.volume_id)?;
        let target = require_path("target_path", &request.target_path)?;
        if self.data_dir.join(KEEP_FAILED_BIND).exists()
            && !self.published_at(&request.volume_id).contains(&target)
        {
            // As a plugin that unpublishes only what it recorded as published: the bind
            // of a failed publish is the CO's to find.
            self.leave("NodeUnpublishVolume").await;
            return Ok(Response::new(pb::NodeUnpublishVolumeResponse {}));
        }
        while mount_at(&target).is_some() {
            unmount(&target)?;
        }
        // The plugin created the target; it removes it.
        match std::fs::remove_dir(&target) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => {
                return Err(Status::internal(format!(
                    "removing {}: {e}",
                    target.display()
                )));
            }
        }
        self.record_publication(&request.volume_id, &target, false)?;
        self.leave("NodeUnpublishVolume").await;
        Ok(Response::new(pb::NodeUnpublishVolumeResponse {}))
    }

    async fn node_get_capabilities(
        &self,
        _: Request<pb::NodeGetCapabilitiesRequest>,
    ) -> Result<Response<pb::NodeGetCapabilitiesResponse>, Status> {
        use pb::node_service_capability::{Rpc, Type, rpc};
        self.enter("NodeGetCapabilities", String::new()).await;
        let rpc = |t: rpc::Type| pb::NodeServiceCapability {
            r#type: Some(Type::Rpc(Rpc { r#type: t as i32 })),
        };
        Ok(Response::new(pb::NodeGetCapabilitiesResponse {
            capabilities: vec![
                rpc(rpc::Type::StageUnstageVolume),
                rpc(rpc::Type::ExpandVolume),
            ],
        }))
    }

    async fn node_expand_volume(
        &self,
        request: Request<pb::NodeExpandVolumeRequest>,
    ) -> Result<Response<pb::NodeExpandVolumeResponse>, Status> {
        let request = request.into_inner();
        let required = request.capacity_range.map_or(0, |r| r.required_bytes);
        self.enter(
            "NodeExpandVolume",
            format!(
                "volume={} path={} required={required}",
                request.volume_id, request.volume_path
            ),
        )
        .await;
        self.volume_dir(&request.volume_id)?;
        let path = require_path("volume_path", &request.volume_path)?;
        // The spec: volume_path is where the volume is published (or staged).
        if mount_at(&path).is_none() {
            return Err(Status::not_found(format!(
                "volume {:?} is not published at {}",
                request.volume_id,
                path.display()
            )));
        }
        Ok(Response::new(pb::NodeExpandVolumeResponse {
            capacity_bytes: required,
        }))
    }

    async fn node_get_info(
        &self,
        _: Request<pb::NodeGetInfoRequest>,
    ) -> Result<Response<pb::NodeGetInfoResponse>, Status> {
        self.enter("NodeGetInfo", String::new()).await;
        Ok(Response::new(pb::NodeGetInfoResponse {
            node_id: self.node_id.clone(),
            max_volumes_per_node: 0,
            accessible_topology: (!self.topology.is_empty()).then(|| pb::Topology {
                segments: self.topology.clone(),
            }),
        }))
    }
}

struct Args {
    data_dir: PathBuf,
    node_id: String,
    endpoint: String,
    hang: Option<String>,
    die: Option<String>,
    not_ready_for: Duration,
    garbage: bool,
    no_socket: bool,
    no_snapshots: bool,
    topology: HashMap<String, String>,
    reaches: Vec<String>,
}

fn parse_args() -> Result<Args, String> {
    let mut args = Args {
        data_dir: PathBuf::new(),
        node_id: std::fs::read_to_string("/proc/sys/kernel/hostname")
            .map(|h| h.trim().to_string())
            .unwrap_or_else(|_| "node".into()),
        endpoint: std::env::var("CSI_ENDPOINT").unwrap_or_default(),
        hang: None,
        die: None,
        not_ready_for: Duration::ZERO,
        garbage: false,
        no_socket: false,
        no_snapshots: false,
        topology: HashMap::new(),
        reaches: Vec::new(),
    };
    let mut iter = std::env::args().skip(1);
    while let Some(flag) = iter.next() {
        let mut value = || iter.next().ok_or_else(|| format!("{flag} needs a value"));
        match flag.as_str() {
            "--data-dir" => args.data_dir = PathBuf::from(value()?),
            "--node-id" => args.node_id = value()?,
            "--endpoint" => args.endpoint = value()?,
            "--hang" => args.hang = Some(value()?),
            "--die" => args.die = Some(value()?),
            "--not-ready-for" => {
                let secs: f64 = value()?
                    .parse()
                    .map_err(|e| format!("--not-ready-for: {e}"))?;
                args.not_ready_for = Duration::from_secs_f64(secs);
            }
            "--garbage" => args.garbage = true,
            "--no-socket" => args.no_socket = true,
            "--no-snapshots" => args.no_snapshots = true,
            "--reaches" => args.reaches.push(value()?),
            "--topology" => {
                let pair = value()?;
                let (key, value) = pair
                    .split_once('=')
                    .ok_or_else(|| format!("--topology {pair:?} is not KEY=VALUE"))?;
                args.topology.insert(key.to_string(), value.to_string());
            }
            other => return Err(format!("unknown argument {other:?}")),
        }
    }
    if args.data_dir.as_os_str().is_empty() {
        return Err("--data-dir is required".into());
    }
    if !args.endpoint.starts_with("unix://") {
        return Err(format!(
            "the endpoint must be unix:///path, got {:?} (set CSI_ENDPOINT)",
            args.endpoint
        ));
    }
    Ok(args)
}

#[tokio::main(flavor = "current_thread")]
async fn main() {
    let args = match parse_args() {
        Ok(args) => args,
        Err(why) => {
            eprintln!("csi-hostpath: {why}");
            std::process::exit(2);
        }
    };
    if args.no_socket {
        log("not creating a socket, as asked".into());
        std::future::pending::<()>().await;
    }
    let socket = PathBuf::from(args.endpoint.trim_start_matches("unix://"));
    let _ = std::fs::remove_file(&socket);
    if let Err(e) = std::fs::create_dir_all(&args.data_dir) {
        eprintln!("csi-hostpath: creating {}: {e}", args.data_dir.display());
        std::process::exit(1);
    }
    let listener = match tokio::net::UnixListener::bind(&socket) {
        Ok(listener) => listener,
        Err(e) => {
            eprintln!("csi-hostpath: listening on {}: {e}", socket.display());
            std::process::exit(1);
        }
    };
    log(format!(
        "listening on {} (data in {})",
        socket.display(),
        args.data_dir.display()
    ));
    if args.garbage {
        loop {
            if let Ok((mut stream, _)) = listener.accept().await {
                use tokio::io::AsyncWriteExt;
                let _ = stream
                    .write_all(b"this is not HTTP/2, let alone gRPC\r\n\r\n")
                    .await;
            }
        }
    }
    let plugin = Plugin {
        data_dir: args.data_dir,
        node_id: args.node_id,
        hang: args.hang,
        die: args.die,
        ready_at: Instant::now() + args.not_ready_for,
        snapshots: !args.no_snapshots,
        topology: args.topology,
        reaches: args.reaches,
    };
    let served = tonic::transport::Server::builder()
        .add_service(pb::identity_server::IdentityServer::new(plugin.clone()))
        .add_service(pb::controller_server::ControllerServer::new(plugin.clone()))
        .add_service(pb::node_server::NodeServer::new(plugin))
        .serve_with_incoming_shutdown(
            tokio_stream::wrappers::UnixListenerStream::new(listener),
            async {
                let _ = tokio::signal::ctrl_c().await;
            },
        )
        .await;
    if let Err(e) = served {
        eprintln!("csi-hostpath: serving: {e}");
        std::process::exit(1);
    }
}
