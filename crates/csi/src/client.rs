//! A CSI client over a Unix socket. Every call has a deadline; ABORTED, UNAVAILABLE,
//! DEADLINE_EXCEEDED and RESOURCE_EXHAUSTED are retried with backoff until the
//! operation's budget is spent; UNIMPLEMENTED and every other code are not. NOT_FOUND
//! from an unpublish or unstage means the work is already undone, which is success.
//! Errors name the plugin, the RPC, the volume and what to check.

use std::collections::HashMap;
use std::fmt;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use tonic::Code;
use tonic::transport::{Channel, Endpoint, Uri};
use tracing::Instrument;

use berth_model::csi::{Capabilities, SnapshotInfo, Timeouts, Usage};

/// The most snapshots `ListSnapshots` reads from one plugin.
pub const MAX_LISTED_SNAPSHOTS: usize = 4096;
/// The longest id of a plugin's berth keeps (the CSI spec allows 128 bytes).
const MAX_ID_BYTES: usize = 256;
use berth_proto::csi as pb;
use pb::controller_client::ControllerClient;
use pb::identity_client::IdentityClient;
use pb::node_client::NodeClient;

/// Why a CSI call failed, in words a person can act on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CsiError {
    pub plugin: String,
    pub rpc: &'static str,
    pub volume: Option<String>,
    pub code: Code,
    pub message: String,
    /// Attempts made (more than one when the code was retryable).
    pub attempts: u32,
    pub socket: PathBuf,
}

impl CsiError {
    fn hint(&self) -> String {
        match self.code {
            Code::Unavailable => format!(
                "is the plugin task running, and is its socket at {}?",
                self.socket.display()
            ),
            Code::DeadlineExceeded => {
                "the plugin did not answer in time; it may be hung (see its task logs)".into()
            }
            Code::NotFound => "the plugin does not know this volume: check its external_id".into(),
            Code::AlreadyExists => match self.rpc {
                "NodeStageVolume" => {
                    "the volume is already staged on this node with other settings or at \
                     another path"
                        .into()
                }
                "NodePublishVolume" => {
                    "the volume is already published at that target with other settings".into()
                }
                "CreateVolume" => {
                    "a volume of that name exists with other parameters or capacity".into()
                }
                _ => "the plugin has this already, with other settings".into(),
            },
            Code::FailedPrecondition => {
                "the plugin says a step that must come first has not happened".into()
            }
            Code::InvalidArgument => "the plugin refused the request's arguments".into(),
            Code::Unimplemented => format!("the plugin does not implement {}", self.rpc),
            Code::ResourceExhausted => "the plugin or its storage is out of capacity".into(),
            Code::PermissionDenied | Code::Unauthenticated => "check the volume's secrets".into(),
            Code::Aborted => "another operation on this volume is still pending".into(),
            _ => "see the plugin task's logs".into(),
        }
    }
}

impl fmt::Display for CsiError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "CSI plugin {:?}: {}", self.plugin, self.rpc)?;
        if let Some(volume) = &self.volume {
            write!(f, " of volume {volume:?}")?;
        }
        let message = if self.message.is_empty() {
            "(no message)"
        } else {
            self.message.as_str()
        };
        write!(f, " failed: {message} [{:?}", self.code)?;
        if self.attempts > 1 {
            write!(f, ", {} attempts", self.attempts)?;
        }
        write!(f, "]; {}", self.hint())
    }
}

impl std::error::Error for CsiError {}

impl CsiError {
    /// Whether the plugin may have acted although the call failed: it timed out, the
    /// connection went, or the plugin failed inside. A refusal (NOT_FOUND,
    /// FAILED_PRECONDITION, INVALID_ARGUMENT, …) says it did not.
    pub fn outcome_unknown(&self) -> bool {
        matches!(
            self.code,
            Code::DeadlineExceeded
                | Code::Unavailable
                | Code::Cancelled
                | Code::Unknown
                | Code::Internal
                | Code::DataLoss
        )
    }
}

/// A gRPC code as the gRPC spec names it (`NOT_FOUND`), for metric labels.
fn grpc_code_name(code: Code) -> String {
    let mut name = String::new();
    for (i, c) in format!("{code:?}").chars().enumerate() {
        if c.is_ascii_uppercase() && i > 0 {
            name.push('_');
        }
        name.push(c.to_ascii_uppercase());
    }
    name
}

fn retryable(code: Code) -> bool {
    matches!(
        code,
        Code::Aborted | Code::Unavailable | Code::DeadlineExceeded | Code::ResourceExhausted
    )
}

/// A client for one plugin socket. Cheap to clone.
#[derive(Clone)]
pub struct CsiClient {
    plugin: String,
    socket: PathBuf,
    channel: Channel,
    timeouts: Timeouts,
    /// Where each RPC is recorded (plugin, method, code, latency); `None` records nothing.
    metrics: Option<berth_telemetry::Metrics>,
}

/// A volume the controller created.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CreatedVolume {
    pub external_id: String,
    pub capacity_bytes: i64,
    pub context: HashMap<String, String>,
    pub accessible_topology: Vec<std::collections::BTreeMap<String, String>>,
}

/// The arguments shared by stage and publish.
#[derive(Debug, Clone)]
pub struct NodeVolume<'a> {
    pub external_id: &'a str,
    pub usage: Usage,
    pub publish_context: &'a HashMap<String, String>,
    pub volume_context: &'a HashMap<String, String>,
    pub secrets: &'a HashMap<String, String>,
}

impl CsiClient {
    /// A client for the plugin listening at `socket`. Connects lazily: a plugin that is
    /// not listening yet makes each call fail with UNAVAILABLE (retried), not this.
    pub fn new(plugin: &str, socket: &Path, timeouts: Timeouts) -> CsiClient {
        let path = socket.to_path_buf();
        // The URI is required by tonic and never used: the connector dials the socket.
        let channel = Endpoint::from_static("http://csi.invalid")
            .connect_timeout(timeouts.call)
            .connect_with_connector_lazy(tower::service_fn(move |_: Uri| {
                let path = path.clone();
                async move {
                    let stream = tokio::net::UnixStream::connect(path).await?;
                    Ok::<_, std::io::Error>(hyper_util::rt::TokioIo::new(stream))
                }
            }));
        CsiClient {
            plugin: plugin.to_string(),
            socket: socket.to_path_buf(),
            channel,
            timeouts,
            metrics: None,
        }
    }

    /// The same client, recording each RPC in `metrics`.
    pub fn measured(self, metrics: berth_telemetry::Metrics) -> CsiClient {
        CsiClient {
            metrics: Some(metrics),
            ..self
        }
    }

    pub fn with_timeouts(&self, timeouts: Timeouts) -> CsiClient {
        CsiClient {
            timeouts,
            ..self.clone()
        }
    }

    pub fn socket(&self) -> &Path {
        &self.socket
    }

    /// Runs `attempt` until it succeeds, fails with a code that is not retryable, or
    /// the budget is spent.
    async fn call<T, F, Fut>(
        &self,
        rpc: &'static str,
        volume: Option<&str>,
        attempt: F,
    ) -> Result<T, CsiError>
    where
        F: FnMut(Channel) -> Fut,
        Fut: std::future::Future<Output = Result<tonic::Response<T>, tonic::Status>>,
    {
        let span = tracing::info_span!(
            "csi_rpc",
            plugin = %self.plugin,
            rpc = %rpc,
            volume = %volume.unwrap_or("-")
        );
        let started = Instant::now();
        let result = self
            .call_in_span(rpc, volume, attempt)
            .instrument(span)
            .await;
        if let Some(metrics) = &self.metrics {
            let code = match &result {
                Ok(_) => Code::Ok,
                Err(error) => error.code,
            };
            metrics.csi_rpc(&self.plugin, rpc, &grpc_code_name(code), started.elapsed());
        }
        result
    }

    async fn call_in_span<T, F, Fut>(
        &self,
        rpc: &'static str,
        volume: Option<&str>,
        mut attempt: F,
    ) -> Result<T, CsiError>
    where
        F: FnMut(Channel) -> Fut,
        Fut: std::future::Future<Output = Result<tonic::Response<T>, tonic::Status>>,
    {
        let started = Instant::now();
        let mut backoff = Duration::from_millis(50);
        let mut attempts = 0;
        loop {
            attempts += 1;
            let attempt_started = Instant::now();
            let no_answer = || {
                tonic::Status::deadline_exceeded(format!(
                    "no answer within {:?}",
                    self.timeouts.call
                ))
            };
            let status =
                match tokio::time::timeout(self.timeouts.call, attempt(self.channel.clone())).await
                {
                    Ok(Ok(response)) => return Ok(response.into_inner()),
                    // tonic reports its own enforcement of the request's timeout as
                    // CANCELLED; for the caller it is a deadline that passed.
                    Ok(Err(status))
                        if status.code() == Code::Cancelled
                            && attempt_started.elapsed() >= self.timeouts.call =>
                    {
                        no_answer()
                    }
                    Ok(Err(status)) => status,
                    Err(_) => no_answer(),
                };
            let spent = started.elapsed();
            if !retryable(status.code()) || spent + backoff >= self.timeouts.total {
                return Err(CsiError {
                    plugin: self.plugin.clone(),
                    rpc,
                    volume: volume.map(str::to_string),
                    code: status.code(),
                    message: status_message(&status, &self.socket),
                    attempts,
                    socket: self.socket.clone(),
                });
            }
            tracing::debug!(code = ?status.code(), "retrying a CSI call");
            tokio::time::sleep(backoff).await;
            backoff = (backoff * 2).min(Duration::from_secs(1));
        }
    }

    fn request<T>(&self, message: T) -> tonic::Request<T> {
        let mut request = tonic::Request::new(message);
        request.set_timeout(self.timeouts.call);
        request
    }

    /// Whether the plugin is ready; an unset `ready` means ready.
    pub async fn probe(&self) -> Result<bool, CsiError> {
        let response = self
            .call("Probe", None, |channel| async move {
                IdentityClient::new(channel)
                    .probe(self.request(pb::ProbeRequest {}))
                    .await
            })
            .await?;
        Ok(response.ready.unwrap_or(true))
    }

    pub async fn plugin_info(&self) -> Result<(String, String), CsiError> {
        let info = self
            .call("GetPluginInfo", None, |channel| async move {
                IdentityClient::new(channel)
                    .get_plugin_info(self.request(pb::GetPluginInfoRequest {}))
                    .await
            })
            .await?;
        Ok((info.name, info.vendor_version))
    }

    pub async fn plugin_capabilities(&self) -> Result<bool, CsiError> {
        use pb::plugin_capability::{Type, service};
        let response = self
            .call("GetPluginCapabilities", None, |channel| async move {
                IdentityClient::new(channel)
                    .get_plugin_capabilities(self.request(pb::GetPluginCapabilitiesRequest {}))
                    .await
            })
            .await?;
        Ok(response.capabilities.iter().any(|c| {
            matches!(&c.r#type, Some(Type::Service(s)) if s.r#type == service::Type::ControllerService as i32)
        }))
    }

    /// NodeGetInfo: the node id, and where the node is (its accessible topology).
    pub async fn node_info(
        &self,
    ) -> Result<(String, std::collections::BTreeMap<String, String>), CsiError> {
        let info = self
            .call("NodeGetInfo", None, |channel| async move {
                NodeClient::new(channel)
                    .node_get_info(self.request(pb::NodeGetInfoRequest {}))
                    .await
            })
            .await?;
        let topology = info
            .accessible_topology
            .map(|t| t.segments.into_iter().collect())
            .unwrap_or_default();
        Ok((info.node_id, topology))
    }

    /// Whether the node service stages (STAGE_UNSTAGE_VOLUME) and expands
    /// (EXPAND_VOLUME).
    pub async fn node_capabilities(&self) -> Result<(bool, bool), CsiError> {
        use pb::node_service_capability::{Type, rpc};
        let response = self
            .call("NodeGetCapabilities", None, |channel| async move {
                NodeClient::new(channel)
                    .node_get_capabilities(self.request(pb::NodeGetCapabilitiesRequest {}))
                    .await
            })
            .await?;
        let has = |wanted: rpc::Type| {
            response
                .capabilities
                .iter()
                .any(|c| matches!(&c.r#type, Some(Type::Rpc(r)) if r.r#type == wanted as i32))
        };
        Ok((
            has(rpc::Type::StageUnstageVolume),
            has(rpc::Type::ExpandVolume),
        ))
    }

    /// What the controller service can do, into `capabilities`.
    pub async fn controller_capabilities(
        &self,
        capabilities: &mut Capabilities,
    ) -> Result<(), CsiError> {
        use pb::controller_service_capability::{Type, rpc};
        let response = self
            .call("ControllerGetCapabilities", None, |channel| async move {
                ControllerClient::new(channel)
                    .controller_get_capabilities(
                        self.request(pb::ControllerGetCapabilitiesRequest {}),
                    )
                    .await
            })
            .await?;
        let has = |wanted: rpc::Type| {
            response
                .capabilities
                .iter()
                .any(|c| matches!(&c.r#type, Some(Type::Rpc(r)) if r.r#type == wanted as i32))
        };
        capabilities.controller_publish = has(rpc::Type::PublishUnpublishVolume);
        capabilities.create_delete = has(rpc::Type::CreateDeleteVolume);
        capabilities.snapshots = has(rpc::Type::CreateDeleteSnapshot);
        capabilities.list_snapshots = has(rpc::Type::ListSnapshots);
        capabilities.controller_expand = has(rpc::Type::ExpandVolume);
        Ok(())
    }

    /// CreateSnapshot of the plugin's volume `source`, named `name` (the spec's
    /// idempotency key).
    pub async fn create_snapshot(
        &self,
        source: &str,
        name: &str,
        secrets: &HashMap<String, String>,
    ) -> Result<SnapshotInfo, CsiError> {
        let response = self
            .call("CreateSnapshot", Some(source), |channel| async move {
                ControllerClient::new(channel)
                    .create_snapshot(self.request(pb::CreateSnapshotRequest {
                        source_volume_id: source.to_string(),
                        name: name.to_string(),
                        secrets: secrets.clone(),
                        parameters: HashMap::new(),
                    }))
                    .await
            })
            .await?;
        match response.snapshot {
            Some(snapshot) if !snapshot.snapshot_id.is_empty() => Ok(self.snapshot_info(snapshot)),
            _ => Err(self.malformed(
                "CreateSnapshot",
                source,
                "the plugin answered without a snapshot id",
            )),
        }
    }

    /// DeleteSnapshot; a snapshot the plugin does not know is already deleted.
    pub async fn delete_snapshot(
        &self,
        snapshot_id: &str,
        secrets: &HashMap<String, String>,
    ) -> Result<(), CsiError> {
        let result = self
            .call("DeleteSnapshot", None, |channel| async move {
                ControllerClient::new(channel)
                    .delete_snapshot(self.request(pb::DeleteSnapshotRequest {
                        snapshot_id: snapshot_id.to_string(),
                        secrets: secrets.clone(),
                    }))
                    .await
            })
            .await;
        already_undone(result.map(|_| ()))
    }

    /// ListSnapshots, page by page, at most [`MAX_LISTED_SNAPSHOTS`] in all.
    pub async fn list_snapshots(&self) -> Result<Vec<SnapshotInfo>, CsiError> {
        let mut listed = Vec::new();
        let mut token = String::new();
        loop {
            let starting_token = token.clone();
            let response = self
                .call("ListSnapshots", None, |channel| {
                    let starting_token = starting_token.clone();
                    async move {
                        ControllerClient::new(channel)
                            .list_snapshots(self.request(pb::ListSnapshotsRequest {
                                max_entries: 256,
                                starting_token,
                                ..Default::default()
                            }))
                            .await
                    }
                })
                .await?;
            listed.extend(
                response
                    .entries
                    .into_iter()
                    .filter_map(|entry| entry.snapshot)
                    .map(|snapshot| self.snapshot_info(snapshot)),
            );
            if listed.len() >= MAX_LISTED_SNAPSHOTS {
                listed.truncate(MAX_LISTED_SNAPSHOTS);
                return Ok(listed);
            }
            if response.next_token.is_empty() || response.next_token == token {
                return Ok(listed);
            }
            token = response.next_token;
        }
    }

    /// ControllerExpandVolume to at least `required` bytes: the capacity the plugin gave
    /// and whether the nodes must expand too.
    pub async fn controller_expand(
        &self,
        external_id: &str,
        required: i64,
        usage: Usage,
        secrets: &HashMap<String, String>,
    ) -> Result<(i64, bool), CsiError> {
        let response = self
            .call(
                "ControllerExpandVolume",
                Some(external_id),
                |channel| async move {
                    ControllerClient::new(channel)
                        .controller_expand_volume(self.request(pb::ControllerExpandVolumeRequest {
                            volume_id: external_id.to_string(),
                            capacity_range: Some(pb::CapacityRange {
                                required_bytes: required,
                                limit_bytes: 0,
                            }),
                            secrets: secrets.clone(),
                            volume_capability: Some(super::volume_capability(&usage)),
                        }))
                        .await
                },
            )
            .await?;
        Ok((response.capacity_bytes, response.node_expansion_required))
    }

    /// NodeExpandVolume of the volume published at `volume_path` (plugin paths).
    pub async fn node_expand(
        &self,
        external_id: &str,
        volume_path: &Path,
        staging_path: Option<&Path>,
        required: i64,
        usage: Usage,
    ) -> Result<i64, CsiError> {
        let response = self
            .call(
                "NodeExpandVolume",
                Some(external_id),
                |channel| async move {
                    NodeClient::new(channel)
                        .node_expand_volume(
                            self.request(pb::NodeExpandVolumeRequest {
                                volume_id: external_id.to_string(),
                                volume_path: volume_path.display().to_string(),
                                capacity_range: Some(pb::CapacityRange {
                                    required_bytes: required,
                                    limit_bytes: 0,
                                }),
                                staging_target_path: staging_path
                                    .map(|p| p.display().to_string())
                                    .unwrap_or_default(),
                                volume_capability: Some(super::volume_capability(&usage)),
                                secrets: HashMap::new(),
                            }),
                        )
                        .await
                },
            )
            .await?;
        Ok(response.capacity_bytes)
    }

    /// A snapshot in berth's terms, its strings clipped: the plugin is not trusted to
    /// keep them short.
    fn snapshot_info(&self, snapshot: pb::Snapshot) -> SnapshotInfo {
        SnapshotInfo {
            plugin_id: self.plugin.clone(),
            snapshot_id: berth_model::text::clip(&snapshot.snapshot_id, MAX_ID_BYTES),
            source_volume_id: berth_model::text::clip(&snapshot.source_volume_id, MAX_ID_BYTES),
            size_bytes: snapshot.size_bytes.max(0),
            created_at: snapshot.creation_time.map_or(0, |t| t.seconds),
            ready_to_use: snapshot.ready_to_use,
        }
    }

    fn malformed(&self, rpc: &'static str, volume: &str, message: &str) -> CsiError {
        CsiError {
            plugin: self.plugin.clone(),
            rpc,
            volume: Some(volume.to_string()),
            code: Code::Internal,
            message: message.into(),
            attempts: 1,
            socket: self.socket.clone(),
        }
    }

    pub async fn create_volume(
        &self,
        name: &str,
        capacity: (i64, i64),
        usages: &[Usage],
        parameters: &HashMap<String, String>,
        secrets: &HashMap<String, String>,
    ) -> Result<CreatedVolume, CsiError> {
        let response = self
            .call("CreateVolume", Some(name), |channel| async move {
                ControllerClient::new(channel)
                    .create_volume(self.request(pb::CreateVolumeRequest {
                        name: name.to_string(),
                        capacity_range: (capacity != (0, 0)).then_some(pb::CapacityRange {
                            required_bytes: capacity.0,
                            limit_bytes: capacity.1,
                        }),
                        volume_capabilities: usages.iter().map(super::volume_capability).collect(),
                        parameters: parameters.clone(),
                        secrets: secrets.clone(),
                        ..Default::default()
                    }))
                    .await
            })
            .await?;
        let volume = response.volume.unwrap_or_default();
        if volume.volume_id.is_empty() {
            return Err(CsiError {
                plugin: self.plugin.clone(),
                rpc: "CreateVolume",
                volume: Some(name.to_string()),
                code: Code::Internal,
                message: "the plugin answered without a volume id".into(),
                attempts: 1,
                socket: self.socket.clone(),
            });
        }
        Ok(CreatedVolume {
            external_id: volume.volume_id,
            capacity_bytes: volume.capacity_bytes,
            context: volume.volume_context,
            accessible_topology: volume
                .accessible_topology
                .into_iter()
                .map(|t| t.segments.into_iter().collect())
                .collect(),
        })
    }

    pub async fn controller_publish(
        &self,
        volume: &NodeVolume<'_>,
        node_id: &str,
    ) -> Result<HashMap<String, String>, CsiError> {
        let response = self
            .call(
                "ControllerPublishVolume",
                Some(volume.external_id),
                |channel| async move {
                    ControllerClient::new(channel)
                        .controller_publish_volume(self.request(
                            pb::ControllerPublishVolumeRequest {
                                volume_id: volume.external_id.to_string(),
                                node_id: node_id.to_string(),
                                volume_capability: Some(super::volume_capability(&volume.usage)),
                                readonly: volume.usage.read_only,
                                secrets: volume.secrets.clone(),
                                volume_context: volume.volume_context.clone(),
                            },
                        ))
                        .await
                },
            )
            .await?;
        Ok(response.publish_context)
    }

    pub async fn controller_unpublish(
        &self,
        external_id: &str,
        node_id: &str,
        secrets: &HashMap<String, String>,
    ) -> Result<(), CsiError> {
        let result = self
            .call(
                "ControllerUnpublishVolume",
                Some(external_id),
                |channel| async move {
                    ControllerClient::new(channel)
                        .controller_unpublish_volume(self.request(
                            pb::ControllerUnpublishVolumeRequest {
                                volume_id: external_id.to_string(),
                                node_id: node_id.to_string(),
                                secrets: secrets.clone(),
                            },
                        ))
                        .await
                },
            )
            .await;
        already_undone(result.map(|_| ()))
    }

    /// DeleteVolume; a volume the plugin does not know is already deleted.
    pub async fn delete_volume(
        &self,
        external_id: &str,
        secrets: &HashMap<String, String>,
    ) -> Result<(), CsiError> {
        let result = self
            .call("DeleteVolume", Some(external_id), |channel| async move {
                ControllerClient::new(channel)
                    .delete_volume(self.request(pb::DeleteVolumeRequest {
                        volume_id: external_id.to_string(),
                        secrets: secrets.clone(),
                    }))
                    .await
            })
            .await;
        already_undone(result.map(|_| ()))
    }

    pub async fn node_stage(
        &self,
        volume: &NodeVolume<'_>,
        staging_path: &Path,
    ) -> Result<(), CsiError> {
        self.call(
            "NodeStageVolume",
            Some(volume.external_id),
            |channel| async move {
                NodeClient::new(channel)
                    .node_stage_volume(self.request(pb::NodeStageVolumeRequest {
                        volume_id: volume.external_id.to_string(),
                        publish_context: volume.publish_context.clone(),
                        staging_target_path: staging_path.display().to_string(),
                        volume_capability: Some(super::volume_capability(&volume.usage)),
                        secrets: volume.secrets.clone(),
                        volume_context: volume.volume_context.clone(),
                    }))
                    .await
            },
        )
        .await
        .map(|_| ())
    }

    pub async fn node_unstage(
        &self,
        external_id: &str,
        staging_path: &Path,
    ) -> Result<(), CsiError> {
        let result = self
            .call(
                "NodeUnstageVolume",
                Some(external_id),
                |channel| async move {
                    NodeClient::new(channel)
                        .node_unstage_volume(self.request(pb::NodeUnstageVolumeRequest {
                            volume_id: external_id.to_string(),
                            staging_target_path: staging_path.display().to_string(),
                        }))
                        .await
                },
            )
            .await;
        already_undone(result.map(|_| ()))
    }

    /// `staging_path` is `None` when the plugin does not stage.
    pub async fn node_publish(
        &self,
        volume: &NodeVolume<'_>,
        staging_path: Option<&Path>,
        target_path: &Path,
    ) -> Result<(), CsiError> {
        self.call(
            "NodePublishVolume",
            Some(volume.external_id),
            |channel| async move {
                NodeClient::new(channel)
                    .node_publish_volume(
                        self.request(pb::NodePublishVolumeRequest {
                            volume_id: volume.external_id.to_string(),
                            publish_context: volume.publish_context.clone(),
                            staging_target_path: staging_path
                                .map(|p| p.display().to_string())
                                .unwrap_or_default(),
                            target_path: target_path.display().to_string(),
                            volume_capability: Some(super::volume_capability(&volume.usage)),
                            readonly: volume.usage.read_only,
                            secrets: volume.secrets.clone(),
                            volume_context: volume.volume_context.clone(),
                        }),
                    )
                    .await
            },
        )
        .await
        .map(|_| ())
    }

    pub async fn node_unpublish(
        &self,
        external_id: &str,
        target_path: &Path,
    ) -> Result<(), CsiError> {
        let result = self
            .call(
                "NodeUnpublishVolume",
                Some(external_id),
                |channel| async move {
                    NodeClient::new(channel)
                        .node_unpublish_volume(self.request(pb::NodeUnpublishVolumeRequest {
                            volume_id: external_id.to_string(),
                            target_path: target_path.display().to_string(),
                        }))
                        .await
                },
            )
            .await;
        already_undone(result.map(|_| ()))
    }
}

/// NOT_FOUND from an undo means there is nothing left to undo.
fn already_undone(result: Result<(), CsiError>) -> Result<(), CsiError> {
    match result {
        Err(error) if error.code == Code::NotFound => Ok(()),
        other => other,
    }
}

/// tonic's message, minus the transport noise a person cannot act on.
fn status_message(status: &tonic::Status, socket: &Path) -> String {
    let message = status.message().trim();
    if status.code() == Code::Unavailable && !socket.exists() {
        "cannot connect to the plugin's socket: it does not exist".to_string()
    } else if status.code() == Code::Unavailable && message.contains("transport error") {
        "cannot connect to the plugin's socket".to_string()
    } else if status.code() == Code::Unknown && message.is_empty() {
        "the plugin's answer was not a gRPC response".to_string()
    } else {
        message.to_string()
    }
}
