//! CSI across a cluster's nodes, with the reference plugin as a network storage would be
//! deployed: its controller runs on node-a only, its node part on node-b only, and both
//! see one storage directory. Everything a user asks on node-b that needs the controller
//! (create, snapshot, ControllerPublish for node-b's claim, ControllerUnpublish, delete)
//! is done by node-a's controller, with node-b's CSI node id; stage and publish stay on
//! node-b. The plugin checks the spec's order across both (it refuses a controller
//! unpublish of a volume still staged), so a wrong order fails the test.
//!
//! Also here, as it guards a node's own allocs when it first joins: a node running jobs
//! of its own is refused a first join.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use berth_harness::AgentProcess;
use berth_state::catalog::PluginStatus;
use berth_testkit::etcd::EtcdServer;
use serde_json::Value;

use crate::support;

fn member(etcd: &EtcdServer, name: &str, storage: &Path) -> AgentProcess {
    let endpoint = etcd.endpoint();
    let name = name.to_string();
    let storage = storage.to_path_buf();
    AgentProcess::production(move |_, dir| {
        let bin = dir.join("csi-bin");
        std::fs::create_dir_all(&bin).unwrap();
        std::fs::copy(
            crate::fixture_bins::csi_hostpath(),
            bin.join("csi-hostpath"),
        )
        .unwrap();
        format!(
            r#"name = "{name}"
host_volume "csi-bin" {{
  path      = "{bin}"
  read_only = true
}}
host_volume "csi-data" {{
  path = "{storage}"
}}
csi {{
  rpc_timeout       = "2s"
  operation_timeout = "4s"
  plugin_wait       = "10s"
  privileged_plugin "hostpath" {{
    jobs = ["controller", "nodes", "nodes-a"]
  }}
}}
cluster {{
  store         = "etcd"
  endpoints     = ["{endpoint}"]
  prefix        = "/csi"
  heartbeat_ttl = "3s"
  lost_claim_grace = "2s"
}}
"#,
            bin = bin.display(),
            storage = storage.display(),
        )
    })
}

/// The plugin job, pinned to `node`, providing `kind` with `args`.
fn plugin_job(job: &str, node: &str, kind: &str, args: &[&str]) -> String {
    let args: Vec<String> = args.iter().map(|a| format!("{a:?}")).collect();
    format!(
        r#"job "{job}" {{
  constraint {{
    attribute = "${{node.unique.name}}"
    value     = "{node}"
  }}
  group "p" {{
    volume "bin" {{
      type      = "host"
      source    = "csi-bin"
      read_only = true
    }}
    volume "data" {{
      type   = "host"
      source = "csi-data"
    }}
    task "hostpath" {{
      driver = "exec"
      config {{
        command = "/opt/csi/csi-hostpath"
        args    = ["--endpoint", "${{CSI_ENDPOINT}}", "--data-dir", "/data", {args}]
      }}
      volume_mount {{
        volume      = "bin"
        destination = "/opt/csi"
        read_only   = true
      }}
      volume_mount {{
        volume      = "data"
        destination = "/data"
      }}
      csi_plugin {{
        id   = "hostpath"
        type = "{kind}"
      }}
    }}
  }}
}}
"#,
        args = args.join(", ")
    )
}

const WRITER: &str = r#"
job "writer" {
  group "g" {
    volume "v" {
      type            = "csi"
      source          = "shared"
      access_mode     = "single-node-writer"
      attachment_mode = "file-system"
    }
    task "t" {
      driver = "exec"
      config {
        command = "/bin/sh"
        args    = ["-c", "echo from-node-b > /vol/file; exec sleep 600"]
      }
      volume_mount {
        volume      = "v"
        destination = "/vol"
      }
    }
  }
}
"#;

const VOLUME: &str = r#"
id           = "shared"
name         = "shared"
type         = "csi"
plugin_id    = "hostpath"
capacity_min = "1MiB"
capability {
  access_mode     = "single-node-writer"
  attachment_mode = "file-system"
}
"#;

/// The job's allocs from the cluster: (id, node name, client status).
async fn allocs(agent: &AgentProcess, job: &str) -> Vec<(String, String, String)> {
    let listed: Value = agent
        .client()
        .get(&format!("/v1/job/{job}/allocations"))
        .await
        .unwrap();
    listed
        .as_array()
        .unwrap()
        .iter()
        .map(|a| {
            let field = |k: &str| a[k].as_str().unwrap_or_default().to_string();
            (field("ID"), field("NodeName"), field("ClientStatus"))
        })
        .collect()
}

/// Waits for the job's one alloc to run on `node`; its id.
async fn running_on(agent: &AgentProcess, job: &str, node: &str) -> String {
    let deadline = Instant::now() + Duration::from_secs(40);
    loop {
        let now = allocs(agent, job).await;
        if let Some((id, ..)) = now
            .iter()
            .find(|(_, on, status)| on == node && status == "running")
        {
            return id.clone();
        }
        assert!(
            Instant::now() < deadline,
            "{job} never ran on {node}: {now:?}\n{}",
            agent.output()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// The plugin task's stdout (one line per RPC) in the alloc dir of `agent`.
fn plugin_log(agent: &AgentProcess, alloc: &str) -> String {
    let logs = agent
        .path()
        .join("data/allocs")
        .join(alloc)
        .join("alloc/logs");
    let mut text = String::new();
    for entry in std::fs::read_dir(logs).into_iter().flatten().flatten() {
        if entry
            .file_name()
            .to_string_lossy()
            .starts_with("hostpath.stdout")
        {
            text.push_str(&std::fs::read_to_string(entry.path()).unwrap_or_default());
        }
    }
    text
}

async fn wait_for(what: &str, within: Duration, mut done: impl FnMut() -> bool) {
    let deadline = Instant::now() + within;
    while !done() {
        assert!(Instant::now() < deadline, "{what}: not within {within:?}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Host mounts under the agent's CSI dir, other than the dir itself.
fn csi_mounts(agent: &AgentProcess) -> Vec<PathBuf> {
    let root = agent
        .path()
        .join("data/csi")
        .canonicalize()
        .unwrap_or_default();
    support::host_mounts_under(&root)
        .into_iter()
        .map(|m| m.mount_point)
        .filter(|p| *p != root)
        .collect()
}

/// Two members on one etcd and one storage dir: the plugin's controller on node-a (its
/// storage reaches node-b), its node part on node-b, both running. The plugins' alloc
/// ids are the last two.
async fn split_plugin() -> (
    EtcdServer,
    tempfile::TempDir,
    AgentProcess,
    AgentProcess,
    String,
    String,
) {
    let etcd = EtcdServer::start();
    let storage = tempfile::Builder::new()
        .prefix("berth-e2e-storage")
        .tempdir_in("/tmp")
        .unwrap();
    let mut a = member(&etcd, "node-a", storage.path());
    let mut b = member(&etcd, "node-b", storage.path());
    a.start().await;
    b.start().await;
    a.submit(
        "controller.hcl",
        &plugin_job(
            "controller",
            "node-a",
            "controller",
            &["--node-id", "node-a", "--reaches", "node-b"],
        ),
    )
    .await
    .unwrap();
    b.submit(
        "nodes.hcl",
        &plugin_job("nodes", "node-b", "node", &["--node-id", "node-b"]),
    )
    .await
    .unwrap();
    let controller = running_on(&a, "controller", "node-a").await;
    let node_plugin = running_on(&b, "nodes", "node-b").await;
    (etcd, storage, a, b, controller, node_plugin)
}

/// Waits until `agent` sees the plugin with this many healthy controllers and nodes.
async fn plugin_healthy(agent: &AgentProcess, controllers: usize, nodes: usize) {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let plugins: Vec<PluginStatus> = agent.client().get("/v1/berth/plugins").await.unwrap();
        let plugin = plugins.iter().find(|p| p.id == "hostpath");
        if plugin.is_some_and(|p| p.controllers_healthy == controllers && p.nodes_healthy == nodes)
        {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "the plugin never got {controllers} healthy controllers and {nodes} nodes: \
             {plugin:#?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn controller_operations_asked_on_one_node_are_done_by_the_controller_on_another() {
    // etcd runs until the end of the test.
    let (_etcd, storage, a, b, controller, node_plugin) = split_plugin().await;
    plugin_healthy(&b, 1, 1).await;
    // `plugin status` on either node shows both nodes' parts.
    let (code, out, err) = a.cli(&["plugin", "status", "hostpath"]);
    assert_eq!(code, 0, "{err}");
    assert!(
        out.contains("node-a") && out.contains("node-b"),
        "both nodes' providers shown: {out}"
    );

    // Created on node-b, which has no controller: node-a's controller creates it.
    let spec = b.path().join("shared.hcl");
    std::fs::write(&spec, VOLUME).unwrap();
    let (code, out, err) = b.cli(&["volume", "create", spec.to_str().unwrap()]);
    assert_eq!(code, 0, "{out}{err}\n{}", b.output());
    assert!(out.contains("Created volume \"shared\""), "{out}");
    assert!(storage.path().join("shared").is_dir(), "CreateVolume ran");
    assert!(plugin_log(&a, &controller).contains("CreateVolume"));
    assert!(!plugin_log(&b, &node_plugin).contains("CreateVolume"));

    // A snapshot asked on node-b, taken by node-a's controller.
    let (code, out, err) = b.cli(&["volume", "snapshot", "create", "shared", "before"]);
    assert_eq!(code, 0, "{out}{err}");
    assert!(plugin_log(&a, &controller).contains("CreateSnapshot"));

    // A writer can run only on node-b (the only node with the plugin's node part): its
    // claim is ControllerPublished by node-a's controller to node-b's CSI node id, then
    // staged and published on node-b.
    a.submit("writer.hcl", WRITER).await.unwrap();
    let writer = running_on(&a, "writer", "node-b").await;
    wait_for(
        "the writer wrote through the volume",
        Duration::from_secs(20),
        || storage.path().join("shared/file").exists(),
    )
    .await;
    let controller_log = plugin_log(&a, &controller);
    assert!(
        controller_log.contains("ControllerPublishVolume volume=shared node=node-b"),
        "{controller_log}"
    );
    let node_log = plugin_log(&b, &node_plugin);
    assert!(
        node_log.contains("NodeStageVolume") && node_log.contains("NodePublishVolume"),
        "{node_log}"
    );
    assert!(!node_log.contains("ControllerPublishVolume"), "{node_log}");
    assert!(
        csi_mounts(&b)
            .iter()
            .any(|p| p.to_string_lossy().contains(&writer)),
        "published on node-b: {:?}",
        csi_mounts(&b)
    );

    // `volume status` on node-a shows node-b's use of the volume.
    let (code, out, err) = a.cli(&["volume", "status", "shared"]);
    assert_eq!(code, 0, "{err}");
    let on_b = out.split("On node node-b").nth(1).unwrap_or_default();
    assert!(
        on_b.contains("Controller      = published to this node")
            && on_b.contains(&format!("Published       = alloc {}", &writer[..8])),
        "{out}"
    );

    // node-a cannot take node-b's volume away: a forced detach there is refused, naming
    // the alloc and its node, and the claim stays.
    let (code, out, err) = a.cli(&["volume", "detach", "--force", "shared"]);
    assert_ne!(code, 0, "{out}");
    assert!(
        err.contains("in use by running alloc(s)") && err.contains("on node \"node-b\""),
        "{err}"
    );
    let status: Value = b.client().get("/v1/berth/volume/shared").await.unwrap();
    assert_eq!(
        status["claims"].as_array().map(Vec::len),
        Some(1),
        "{status}"
    );

    // Stopped: unpublished and unstaged on node-b, then unpublished by node-a's
    // controller (the plugin refuses that while the volume is staged anywhere).
    let (code, out, err) = a.cli(&["job", "stop", "writer"]);
    assert_eq!(code, 0, "{out}{err}");
    wait_for(
        "node-a's controller unpublished the volume from node-b",
        Duration::from_secs(30),
        || {
            plugin_log(&a, &controller)
                .contains("ControllerUnpublishVolume volume=shared node=node-b")
        },
    )
    .await;
    wait_for(
        "nothing left mounted on node-b",
        Duration::from_secs(10),
        || csi_mounts(&b).is_empty(),
    )
    .await;
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let (_, out, _) = a.cli(&["volume", "status", "shared"]);
        if !out.contains("On node node-b") {
            break;
        }
        assert!(Instant::now() < deadline, "node-b's use stays shown: {out}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    for log in [plugin_log(&a, &controller), plugin_log(&b, &node_plugin)] {
        assert!(!log.contains("SPEC VIOLATION"), "{log}");
    }
    let node_log = plugin_log(&b, &node_plugin);
    assert!(
        node_log.contains("NodeUnpublishVolume") && node_log.contains("NodeUnstageVolume"),
        "{node_log}"
    );

    // Deleted from node-b: the snapshot, then the volume, by node-a's controller.
    let (code, out, err) = b.cli(&["volume", "snapshot", "delete", "hostpath", "before"]);
    assert_eq!(code, 0, "{out}{err}");
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let (code, out, err) = b.cli(&["volume", "delete", "shared"]);
        if code == 0 {
            break;
        }
        // The claim is released just after the alloc stops.
        assert!(Instant::now() < deadline, "{out}{err}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert!(!storage.path().join("shared").exists(), "DeleteVolume ran");
    assert!(plugin_log(&a, &controller).contains("DeleteVolume"));

    // With the controller gone, a create asked on node-b says so instead of hanging.
    let (code, _, err) = a.cli(&["job", "stop", "controller"]);
    assert_eq!(code, 0, "{err}");
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let plugins: Vec<PluginStatus> = b.client().get("/v1/berth/plugins").await.unwrap();
        if plugins
            .iter()
            .find(|p| p.id == "hostpath")
            .is_none_or(|p| p.controllers_healthy == 0)
        {
            break;
        }
        assert!(Instant::now() < deadline, "the controller never left");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let started = Instant::now();
    let (code, _, err) = b.cli(&["volume", "create", spec.to_str().unwrap()]);
    assert_ne!(code, 0);
    assert!(err.contains("controller"), "{err}");
    assert!(
        started.elapsed() < Duration::from_secs(30),
        "{:?}",
        started.elapsed()
    );
}

/// A node that ran jobs on its own is refused a first join while they run (the cluster
/// would stop them); it says which jobs and what to do, and its tasks keep running.
#[tokio::test(flavor = "multi_thread")]
async fn a_node_running_jobs_of_its_own_is_refused_a_first_join_and_keeps_them() {
    let etcd = EtcdServer::start();
    let mut alone = AgentProcess::production(|_, _| String::new());
    alone.start().await;
    let submitted = alone
        .submit(
            "mine.hcl",
            r#"job "mine" {
  group "g" {
    task "t" {
      driver = "exec"
      config {
        command = "/bin/sleep"
        args    = ["600"]
      }
    }
  }
}"#,
        )
        .await
        .unwrap();
    let alloc = submitted.alloc_ids[0].clone();
    alone
        .wait_alloc(&alloc, "running", |s| {
            s.client_status == berth_model::status::ClientStatus::Running
        })
        .await;
    // Stopped (its task keeps running, as Nomad's do) and configured into a cluster.
    alone.kill9();
    let config = alone.path().join("agent.hcl");
    let mut text = std::fs::read_to_string(&config).unwrap();
    text.push_str(&format!(
        "cluster {{\n  store = \"etcd\"\n  endpoints = [\"{}\"]\n  prefix = \"/join\"\n}}\n",
        etcd.endpoint()
    ));
    std::fs::write(&config, text).unwrap();
    let mut joining = std::process::Command::new(env!("CARGO_BIN_EXE_berth"))
        .arg("--config")
        .arg(&config)
        .arg("--data-dir")
        .arg(alone.path().join("data"))
        .arg("agent")
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(20);
    let status = loop {
        if let Some(status) = joining.try_wait().unwrap() {
            break status;
        }
        if Instant::now() > deadline {
            joining.kill().unwrap();
            let _ = joining.wait();
            panic!("the agent joined the cluster with allocs of its own running");
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    let mut stderr = String::new();
    std::io::Read::read_to_string(&mut joining.stderr.take().unwrap(), &mut stderr).unwrap();
    assert!(!status.success());
    assert!(
        stderr.contains("this node runs 1 alloc(s) of jobs submitted to it on its own (\"mine\")")
            && stderr.contains("`berth job stop JOB`"),
        "{stderr}"
    );
    assert!(
        !alone.path().join("data/cluster-id").exists(),
        "nothing recorded of the cluster"
    );
    // Without the cluster block it starts as before and still supervises its task.
    let mut text = std::fs::read_to_string(&config).unwrap();
    text.truncate(text.find("cluster {").unwrap());
    std::fs::write(&config, text).unwrap();
    alone.start().await;
    assert_eq!(
        alone.alloc(&alloc).await.client_status,
        berth_model::status::ClientStatus::Running
    );
    let (code, _, err) = alone.cli(&["job", "stop", "mine"]);
    assert_eq!(code, 0, "{err}");
    alone.finished(&alloc).await;
}

/// A controller on another node that is unhealthy for a moment (restarting, a failed
/// probe) is waited for, as a local one is: the claim is ControllerPublished once it is
/// back, never staged without it. Before, node-b took "no healthy controller elsewhere"
/// for "the plugin has no controller" and staged the volume unpublished, skipping
/// whatever fencing the storage's controller does.
#[tokio::test(flavor = "multi_thread")]
async fn a_claim_waits_for_an_unhealthy_controller_on_another_node_instead_of_skipping_it() {
    // etcd runs until the end of the test.
    let (_etcd, storage, a, b, controller, node_plugin) = split_plugin().await;
    let plugin_on_b = |healthy_controllers: usize| {
        let b = &b;
        async move {
            let deadline = Instant::now() + Duration::from_secs(30);
            loop {
                let plugins: Vec<PluginStatus> = b.client().get("/v1/berth/plugins").await.unwrap();
                let plugin = plugins.iter().find(|p| p.id == "hostpath");
                if plugin.is_some_and(|p| {
                    p.controllers_healthy == healthy_controllers
                        && p.nodes_healthy == 1
                        && p.providers.len() == 2
                }) {
                    return;
                }
                assert!(Instant::now() < deadline, "{plugin:#?}");
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
    };
    plugin_on_b(1).await;
    let spec = b.path().join("shared.hcl");
    std::fs::write(&spec, VOLUME).unwrap();
    let (code, out, err) = b.cli(&["volume", "create", spec.to_str().unwrap()]);
    assert_eq!(code, 0, "{out}{err}");

    // node-a's controller turns unhealthy (still registered), and is back 2 s after the
    // writer is submitted: within the claim's plugin_wait (10 s).
    let not_ready = storage.path().join(".not-ready-node-a");
    std::fs::write(&not_ready, "").unwrap();
    plugin_on_b(0).await;
    a.submit("writer.hcl", WRITER).await.unwrap();
    tokio::time::sleep(Duration::from_secs(2)).await;
    std::fs::remove_file(&not_ready).unwrap();
    running_on(&a, "writer", "node-b").await;

    let controller_log = plugin_log(&a, &controller);
    assert!(
        controller_log.contains("ControllerPublishVolume volume=shared node=node-b"),
        "{controller_log}"
    );
    let node_log = plugin_log(&b, &node_plugin);
    assert_eq!(
        node_log.matches("NodeStageVolume").count(),
        1,
        "staged once, after the controller published: {node_log}"
    );
    assert_eq!(allocs(&a, "writer").await.len(), 1, "the first alloc ran");

    let (code, out, err) = a.cli(&["job", "stop", "writer"]);
    assert_eq!(code, 0, "{out}{err}");
    wait_for(
        "nothing left mounted on node-b",
        Duration::from_secs(30),
        || csi_mounts(&b).is_empty(),
    )
    .await;
}

/// A node that is lost (its machine off) still has the volume attached as far as the
/// storage knows: the plugin publishes a single-node volume to one node at a time. Once
/// the lost alloc's grace has passed, the cluster unpublishes the volume from the lost
/// node (its CSI node id, which the claim recorded) through the controller, and only
/// then releases the claim; the writer, moved to the other node, is published there.
/// Released without that, the other node's ControllerPublish is refused for good.
#[tokio::test(flavor = "multi_thread")]
async fn a_lost_nodes_volume_is_unpublished_from_it_before_another_node_claims_it() {
    let (_etcd, storage, a, mut b, controller, _) = split_plugin().await;
    plugin_healthy(&a, 1, 1).await;
    let spec = a.path().join("shared.hcl");
    std::fs::write(&spec, VOLUME).unwrap();
    let (code, out, err) = a.cli(&["volume", "create", spec.to_str().unwrap()]);
    assert_eq!(code, 0, "{out}{err}");
    // Failed placements (the claim still held) are tried again every 5 s (Nomad's least).
    let writer = WRITER.replace(
        "  group \"g\" {",
        "  reschedule {\n    delay          = \"5s\"\n    delay_function = \"constant\"\n    \
         unlimited      = true\n  }\n  group \"g\" {",
    );
    assert_ne!(writer, WRITER);
    a.submit("writer.hcl", &writer).await.unwrap();
    running_on(&a, "writer", "node-b").await;
    assert!(
        plugin_log(&a, &controller).contains("ControllerPublishVolume volume=shared node=node-b")
    );
    // node-a gets the plugin's node part too: the writer may move there.
    a.submit(
        "nodes-a.hcl",
        &plugin_job("nodes-a", "node-a", "node", &["--node-id", "node-a"]),
    )
    .await
    .unwrap();
    running_on(&a, "nodes-a", "node-a").await;
    plugin_healthy(&a, 1, 2).await;

    // node-b is gone: its agent and every process of it, as when its machine is off.
    // The storage still has the volume staged there (the node never unstaged it).
    b.kill9();
    for pid in support::processes_rooted_under(b.path()) {
        let _ = rustix::process::kill_process(pid, rustix::process::Signal::KILL);
    }
    std::fs::write(storage.path().join(".lost-node-b"), "").unwrap();
    assert!(storage.path().join(".staged/shared/node-b").exists());

    let moved = running_on(&a, "writer", "node-a").await;
    let log = plugin_log(&a, &controller);
    assert!(!log.contains("SPEC VIOLATION"), "{log}");
    let unpublished = log
        .find("ControllerUnpublishVolume volume=shared node=node-b")
        .unwrap_or_else(|| panic!("never unpublished from the lost node: {log}"));
    let published = log
        .find("ControllerPublishVolume volume=shared node=node-a")
        .unwrap_or_else(|| panic!("never published to node-a: {log}"));
    assert!(unpublished < published, "{log}");
    // The claim is the moved writer's alone.
    let status: Value = a.client().get("/v1/volume/csi/shared").await.unwrap();
    let claims: Vec<&str> = status["WriteAllocs"]
        .as_object()
        .map(|w| w.keys().map(String::as_str).collect())
        .unwrap_or_default();
    assert_eq!(claims, [moved.as_str()], "{status}");
}
