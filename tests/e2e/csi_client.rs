//! The CSI client against a scripted plugin over a real Unix socket: which codes are
//! retried, which are not, deadlines, and NOT_FOUND on undo.

use std::collections::VecDeque;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use berth_csi::client::{CsiClient, NodeVolume};
use berth_model::csi::{AccessMode, AttachmentMode, Timeouts, Usage};
use berth_proto::csi as pb;
use tonic::{Code, Request, Response, Status};

/// Answers each Node call with the next scripted outcome (`None`: hang), and counts.
#[derive(Clone, Default)]
struct Scripted {
    outcomes: Arc<Mutex<VecDeque<Option<Code>>>>,
    calls: Arc<Mutex<u32>>,
    ready: Option<bool>,
}

impl Scripted {
    async fn next(&self) -> Result<(), Status> {
        *self.calls.lock().unwrap() += 1;
        let outcome = self
            .outcomes
            .lock()
            .unwrap()
            .pop_front()
            .unwrap_or(Some(Code::Ok));
        match outcome {
            None => std::future::pending().await,
            Some(Code::Ok) => Ok(()),
            Some(code) => Err(Status::new(code, format!("scripted {code:?}"))),
        }
    }
}

#[tonic::async_trait]
impl pb::node_server::Node for Scripted {
    async fn node_stage_volume(
        &self,
        _: Request<pb::NodeStageVolumeRequest>,
    ) -> Result<Response<pb::NodeStageVolumeResponse>, Status> {
        self.next()
            .await
            .map(|()| Response::new(pb::NodeStageVolumeResponse {}))
    }
    async fn node_unstage_volume(
        &self,
        _: Request<pb::NodeUnstageVolumeRequest>,
    ) -> Result<Response<pb::NodeUnstageVolumeResponse>, Status> {
        self.next()
            .await
            .map(|()| Response::new(pb::NodeUnstageVolumeResponse {}))
    }
    async fn node_publish_volume(
        &self,
        _: Request<pb::NodePublishVolumeRequest>,
    ) -> Result<Response<pb::NodePublishVolumeResponse>, Status> {
        self.next()
            .await
            .map(|()| Response::new(pb::NodePublishVolumeResponse {}))
    }
    async fn node_unpublish_volume(
        &self,
        _: Request<pb::NodeUnpublishVolumeRequest>,
    ) -> Result<Response<pb::NodeUnpublishVolumeResponse>, Status> {
        self.next()
            .await
            .map(|()| Response::new(pb::NodeUnpublishVolumeResponse {}))
    }
    async fn node_get_capabilities(
        &self,
        _: Request<pb::NodeGetCapabilitiesRequest>,
    ) -> Result<Response<pb::NodeGetCapabilitiesResponse>, Status> {
        Ok(Response::new(pb::NodeGetCapabilitiesResponse {
            capabilities: vec![],
        }))
    }
    async fn node_get_info(
        &self,
        _: Request<pb::NodeGetInfoRequest>,
    ) -> Result<Response<pb::NodeGetInfoResponse>, Status> {
        Ok(Response::new(pb::NodeGetInfoResponse {
            node_id: "n".into(),
            ..Default::default()
        }))
    }
    async fn node_expand_volume(
        &self,
        _: Request<pb::NodeExpandVolumeRequest>,
    ) -> Result<Response<pb::NodeExpandVolumeResponse>, Status> {
        Err(Status::unimplemented("not scripted"))
    }
}

#[tonic::async_trait]
impl pb::identity_server::Identity for Scripted {
    async fn get_plugin_info(
        &self,
        _: Request<pb::GetPluginInfoRequest>,
    ) -> Result<Response<pb::GetPluginInfoResponse>, Status> {
        Err(Status::unimplemented("no"))
    }
    async fn get_plugin_capabilities(
        &self,
        _: Request<pb::GetPluginCapabilitiesRequest>,
    ) -> Result<Response<pb::GetPluginCapabilitiesResponse>, Status> {
        Err(Status::unimplemented("no"))
    }
    async fn probe(
        &self,
        _: Request<pb::ProbeRequest>,
    ) -> Result<Response<pb::ProbeResponse>, Status> {
        Ok(Response::new(pb::ProbeResponse { ready: self.ready }))
    }
}

struct Served {
    _dir: tempfile::TempDir,
    socket: PathBuf,
    plugin: Scripted,
}

fn serve(plugin: Scripted) -> Served {
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("csi.sock");
    let listener = tokio::net::UnixListener::bind(&socket).unwrap();
    tokio::spawn(
        tonic::transport::Server::builder()
            .add_service(pb::node_server::NodeServer::new(plugin.clone()))
            .add_service(pb::identity_server::IdentityServer::new(plugin.clone()))
            .serve_with_incoming(tokio_stream::wrappers::UnixListenerStream::new(listener)),
    );
    Served {
        _dir: dir,
        socket,
        plugin,
    }
}

fn script(outcomes: &[Option<Code>]) -> Scripted {
    Scripted {
        outcomes: Arc::new(Mutex::new(outcomes.iter().copied().collect())),
        ..Scripted::default()
    }
}

const FAST: Timeouts = Timeouts {
    call: Duration::from_millis(300),
    total: Duration::from_secs(2),
};

fn usage() -> Usage {
    Usage {
        access_mode: AccessMode::SingleNodeWriter,
        attachment_mode: AttachmentMode::FileSystem,
        read_only: false,
    }
}

async fn stage(client: &CsiClient) -> Result<(), berth_csi::client::CsiError> {
    let empty = Default::default();
    let volume = NodeVolume {
        external_id: "vol-1",
        usage: usage(),
        publish_context: &empty,
        volume_context: &empty,
        secrets: &empty,
    };
    client
        .node_stage(&volume, std::path::Path::new("/staging"))
        .await
}

#[tokio::test]
async fn retryable_codes_are_retried_until_success() {
    let served = serve(script(&[
        Some(Code::Unavailable),
        Some(Code::Aborted),
        Some(Code::ResourceExhausted),
        Some(Code::Ok),
    ]));
    let client = CsiClient::new("scripted", &served.socket, FAST);
    stage(&client).await.unwrap();
    assert_eq!(*served.plugin.calls.lock().unwrap(), 4);
}

#[tokio::test]
async fn unimplemented_and_other_codes_are_not_retried_and_read_well() {
    let served = serve(script(&[Some(Code::Unimplemented)]));
    let client = CsiClient::new("scripted", &served.socket, FAST);
    let error = stage(&client).await.unwrap_err();
    assert_eq!(
        *served.plugin.calls.lock().unwrap(),
        1,
        "UNIMPLEMENTED is never retried"
    );
    assert_eq!(
        error.to_string(),
        "CSI plugin \"scripted\": NodeStageVolume of volume \"vol-1\" failed: scripted Unimplemented \
         [Unimplemented]; the plugin does not implement NodeStageVolume"
    );
    let served = serve(script(&[Some(Code::FailedPrecondition)]));
    let client = CsiClient::new("scripted", &served.socket, FAST);
    let error = stage(&client).await.unwrap_err();
    assert_eq!(error.code, Code::FailedPrecondition);
    assert_eq!(*served.plugin.calls.lock().unwrap(), 1);
    assert!(
        error.to_string().contains("a step that must come first"),
        "{error}"
    );
}

#[tokio::test]
async fn not_found_on_undo_is_success_but_not_on_stage() {
    let served = serve(script(&[
        Some(Code::NotFound),
        Some(Code::NotFound),
        Some(Code::NotFound),
    ]));
    let client = CsiClient::new("scripted", &served.socket, FAST);
    client
        .node_unpublish("vol-1", std::path::Path::new("/t"))
        .await
        .unwrap();
    client
        .node_unstage("vol-1", std::path::Path::new("/s"))
        .await
        .unwrap();
    let error = stage(&client).await.unwrap_err();
    assert!(
        error.to_string().contains("check its external_id"),
        "{error}"
    );
}

#[tokio::test]
async fn a_hung_plugin_meets_the_deadline_and_is_retried_within_the_budget() {
    let served = serve(script(&[
        None, None, None, None, None, None, None, None, None, None,
    ]));
    let client = CsiClient::new("scripted", &served.socket, FAST);
    let started = Instant::now();
    let error = stage(&client).await.unwrap_err();
    let took = started.elapsed();
    assert_eq!(error.code, Code::DeadlineExceeded, "{error}");
    assert!(error.to_string().contains("may be hung"), "{error}");
    assert!(error.attempts >= 2, "DEADLINE_EXCEEDED is retried: {error}");
    // The budget bounds the whole operation: at most one call past it, and slack for a
    // busy node. Ten hung attempts with their backoffs would take about 8.5 s.
    assert!(
        took < FAST.total + FAST.call + Duration::from_secs(2),
        "the budget bounds the whole operation: {took:?}"
    );
}

#[tokio::test]
async fn probe_reads_an_unset_ready_as_ready_and_a_missing_socket_says_where() {
    let served = serve(Scripted {
        ready: None,
        ..Scripted::default()
    });
    assert!(
        CsiClient::new("p", &served.socket, FAST)
            .probe()
            .await
            .unwrap()
    );
    let served = serve(Scripted {
        ready: Some(false),
        ..Scripted::default()
    });
    assert!(
        !CsiClient::new("p", &served.socket, FAST)
            .probe()
            .await
            .unwrap()
    );
    let missing = served.socket.with_file_name("nothing.sock");
    let error = CsiClient::new("p", &missing, Timeouts::PROBE)
        .probe()
        .await
        .unwrap_err();
    assert_eq!(error.code, Code::Unavailable);
    let text = error.to_string();
    assert!(
        text.contains("cannot connect to the plugin's socket") && text.contains("nothing.sock"),
        "{text}"
    );
}

/// The reference plugin, run as a plain process on the host, holds the agent's side of
/// the spec to account: these are the answers the agent's unwinding relies on.
#[tokio::test]
async fn the_reference_plugin_is_strict_to_the_spec() {
    let dir = tempfile::Builder::new()
        .prefix("berth-e2e-hostpath")
        .tempdir_in("/tmp")
        .unwrap();
    let root = dir.path().canonicalize().unwrap();
    let data = root.join("data");
    std::fs::create_dir_all(data.join("vol")).unwrap();
    let socket = root.join("csi.sock");
    let plugin = std::process::Command::new(crate::fixture_bins::csi_hostpath())
        .args(["--data-dir", data.to_str().unwrap(), "--node-id", "n1"])
        .args(["--endpoint", &format!("unix://{}", socket.display())])
        .stdout(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let _guard = PluginGuard {
        child: plugin,
        root: root.clone(),
    };
    let client = CsiClient::new("hostpath", &socket, FAST);
    let deadline = Instant::now() + Duration::from_secs(10);
    while client.probe().await.is_err() {
        assert!(Instant::now() < deadline, "the plugin never answered");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let staging = root.join("staging");
    let target = root.join("per-alloc/a1/target");
    std::fs::create_dir_all(&staging).unwrap();
    std::fs::create_dir_all(target.parent().unwrap()).unwrap();
    let empty = Default::default();
    let request = NodeVolume {
        external_id: "vol",
        usage: usage(),
        publish_context: &empty,
        volume_context: &empty,
        secrets: &empty,
    };
    // Unknown volume: NOT_FOUND.
    let unknown = NodeVolume {
        external_id: "nope",
        ..request.clone()
    };
    let error = client.node_stage(&unknown, &staging).await.unwrap_err();
    assert_eq!(error.code, Code::NotFound, "{error}");
    // Stage without the controller's publish context: FAILED_PRECONDITION.
    let error = client.node_stage(&request, &staging).await.unwrap_err();
    assert_eq!(error.code, Code::FailedPrecondition, "{error}");
    let context = client.controller_publish(&request, "n1").await.unwrap();
    let request = NodeVolume {
        publish_context: &context,
        ..request
    };
    // Publish before stage: FAILED_PRECONDITION.
    let error = client
        .node_publish(&request, Some(&staging), &target)
        .await
        .unwrap_err();
    assert_eq!(error.code, Code::FailedPrecondition, "{error}");
    client.node_stage(&request, &staging).await.unwrap();
    client.node_stage(&request, &staging).await.unwrap(); // idempotent
    client
        .node_publish(&request, Some(&staging), &target)
        .await
        .unwrap();
    client
        .node_publish(&request, Some(&staging), &target)
        .await
        .unwrap(); // idempotent
    std::fs::write(target.join("f"), "x").unwrap();
    assert!(data.join("vol/f").exists(), "the target is the volume");
    // The same target read-only: incompatible, ALREADY_EXISTS.
    let read_only = NodeVolume {
        usage: Usage {
            read_only: true,
            ..usage()
        },
        ..request.clone()
    };
    let error = client
        .node_publish(&read_only, Some(&staging), &target)
        .await
        .unwrap_err();
    assert_eq!(error.code, Code::AlreadyExists, "{error}");
    // Undo removes what the plugin made; undoing twice is fine.
    client.node_unpublish("vol", &target).await.unwrap();
    assert!(!target.exists(), "the plugin removes the target it created");
    client.node_unpublish("vol", &target).await.unwrap();
    client.node_unstage("vol", &staging).await.unwrap();
    client.node_unstage("vol", &staging).await.unwrap();
    client
        .controller_unpublish("vol", "n1", &empty)
        .await
        .unwrap();
    assert!(crate::support::host_mounts_under(&root).is_empty());
}

/// Kills the plugin and undoes its mounts, also when a test fails half-way.
struct PluginGuard {
    child: std::process::Child,
    root: PathBuf,
}

impl Drop for PluginGuard {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        crate::support::unmount_everything_under(&self.root);
    }
}
