//! CSI end to end, as a user runs it: the reference plugin (`tests/csi-hostpath`) runs
//! as an exec task with a `csi_plugin` block under a real `berth agent`; volumes are
//! created through its controller, staged and published with real bind mounts that
//! propagate out of the plugin's mount namespace, and bound into consuming tasks.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use berth_client::alloc_runner::AllocStatus;
use berth_harness::AgentProcess;
use berth_model::events::{EventKind, TaskStateKind};
use berth_model::status::ClientStatus;

use crate::support;

/// An agent with the plugin binary in a read-only host volume and a data host volume for
/// the plugin's volumes; CSI deadlines short enough for tests.
pub(crate) fn agent() -> AgentProcess {
    let agent = AgentProcess::with_config("");
    let dir = agent.path().to_path_buf();
    let bin = dir.join("csi-bin");
    std::fs::create_dir_all(&bin).unwrap();
    std::fs::create_dir_all(dir.join("csi-data")).unwrap();
    std::fs::copy(
        crate::fixture_bins::csi_hostpath(),
        bin.join("csi-hostpath"),
    )
    .unwrap();
    // The mock driver (off unless the operator enables it) runs the jobs of the tests
    // that read volumes beside other work.
    let config = format!(
        r#"plugin "mock" {{
  config {{
    enabled = true
  }}
}}
host_volume "csi-bin" {{
  path      = "{dir}/csi-bin"
  read_only = true
}}
host_volume "csi-data" {{
  path = "{dir}/csi-data"
}}
csi {{
  rpc_timeout       = "2s"
  operation_timeout = "4s"
  plugin_wait       = "10s"
  privileged_plugin "hostpath" {{
    jobs = ["plugin", "plugin2", "plugin-a", "plugin-b"]
  }}
  privileged_plugin "hang" {{
    jobs = ["hang"]
  }}
  privileged_plugin "die" {{
    jobs = ["die"]
  }}
  privileged_plugin "silent" {{
    jobs = ["silent"]
  }}
  privileged_plugin "garbage" {{
    jobs = ["garbage"]
  }}
}}
"#,
        dir = dir.display()
    );
    std::fs::write(dir.join("agent.hcl"), config).unwrap();
    agent
}

/// The plugin job: `id` is the plugin id, `args` extra arguments (misbehaviour).
fn plugin_job(job: &str, id: &str, args: &[&str], health_timeout: &str) -> String {
    let args: Vec<String> = ["--data-dir", "/data"]
        .iter()
        .chain(args)
        .map(|a| format!("{a:?}"))
        .collect();
    format!(
        r#"job "{job}" {{
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
    restart {{
      attempts = 5
      delay    = "500ms"
      interval = "1m"
      mode     = "fail"
    }}
    task "hostpath" {{
      driver = "exec"
      config {{
        command = "/opt/csi/csi-hostpath"
        # Interpolated when the task starts, as in Nomad (the plugin refuses a literal).
        args    = ["--endpoint", "${{CSI_ENDPOINT}}", {args}]
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
        id             = "{id}"
        type           = "monolith"
        health_timeout = "{health_timeout}"
      }}
    }}
  }}
}}
"#,
        args = args.join(", ")
    )
}

/// A job whose one task mounts CSI volume `source` at /vol and runs `script`.
fn consumer_job(job: &str, job_type: &str, source: &str, read_only: bool, script: &str) -> String {
    format!(
        r#"job "{job}" {{
  type = "{job_type}"
  group "g" {{
    volume "v" {{
      type            = "csi"
      source          = "{source}"
      access_mode     = "single-node-writer"
      attachment_mode = "file-system"
      read_only       = {read_only}
    }}
    restart {{
      attempts = 0
      mode     = "fail"
    }}
    task "t" {{
      driver = "exec"
      config {{
        command = "/bin/sh"
        args    = ["-c", {script:?}]
      }}
      volume_mount {{
        volume      = "v"
        destination = "/vol"
      }}
    }}
  }}
}}
"#
    )
}

pub(crate) fn volume_spec(id: &str, plugin: &str) -> String {
    format!(
        r#"id        = "{id}"
name      = "{id}"
type      = "csi"
plugin_id = "{plugin}"
capacity_min = "1MiB"
capability {{
  access_mode     = "single-node-writer"
  attachment_mode = "file-system"
}}
"#
    )
}

/// The steps of the CSI tests, on an agent process: the reference plugin as a job, and
/// volumes created with the CLI.
pub(crate) trait CsiSteps {
    /// Runs a plugin job and waits until the plugin is healthy as node and controller.
    async fn run_plugin(&self, job: &str, id: &str, args: &[&str]) -> String;
    /// Creates volume `id` of `plugin` through `berth volume create`.
    fn create_volume(&self, id: &str, plugin: &str);
    /// What the reference plugin of the alloc logged (one line per RPC).
    fn plugin_log(&self, plugin_alloc: &str) -> String;
    /// Mounts on the host below the agent's CSI dir other than the CSI dir itself.
    fn csi_mounts(&self) -> Vec<PathBuf>;
}

impl CsiSteps for AgentProcess {
    async fn run_plugin(&self, job: &str, id: &str, args: &[&str]) -> String {
        let alloc = self.run_job(job, &plugin_job(job, id, args, "10s")).await;
        self.wait_plugin(id, "healthy", |p| {
            p.is_some_and(|p| p.nodes_healthy == 1 && p.controllers_healthy == 1)
        })
        .await;
        alloc
    }

    fn create_volume(&self, id: &str, plugin: &str) {
        let spec = self.write_file(&format!("{id}.hcl"), &volume_spec(id, plugin));
        let (code, out, err) = self.cli(&["volume", "create", spec.to_str().unwrap()]);
        assert_eq!(code, 0, "creating volume {id}: {out}{err}");
    }

    fn plugin_log(&self, plugin_alloc: &str) -> String {
        let logs = self
            .path()
            .join("data/allocs")
            .join(plugin_alloc)
            .join("alloc/logs");
        let mut text = String::new();
        for entry in std::fs::read_dir(logs).unwrap().flatten() {
            let name = entry.file_name().to_string_lossy().into_owned();
            if name.starts_with("hostpath.stdout") {
                text.push_str(&std::fs::read_to_string(entry.path()).unwrap());
            }
        }
        text
    }

    fn csi_mounts(&self) -> Vec<PathBuf> {
        let root = self
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
}

fn rpc_count(log: &str, rpc: &str) -> usize {
    log.lines()
        .filter(|l| l.starts_with(&format!("{rpc} ")))
        .count()
}

fn events(alloc: &AllocStatus, task: &str) -> Vec<(EventKind, String)> {
    alloc.tasks[task]
        .events
        .iter()
        .map(|e| (e.kind, e.message.clone()))
        .collect()
}

fn setup_failure(alloc: &AllocStatus) -> String {
    events(alloc, "t")
        .into_iter()
        .find(|(kind, _)| *kind == EventKind::SetupFailure)
        .map(|(_, message)| message)
        .unwrap_or_else(|| panic!("no Setup Failure: {alloc:#?}"))
}

fn is_running(alloc: &AllocStatus) -> bool {
    alloc.tasks["t"].state == TaskStateKind::Running
}

fn is_dead(alloc: &AllocStatus) -> bool {
    matches!(
        alloc.client_status,
        ClientStatus::Complete | ClientStatus::Failed
    )
}

#[tokio::test(flavor = "multi_thread")]
async fn a_created_volume_is_written_by_one_job_refused_to_a_second_writer_and_read_by_the_next() {
    let mut agent = agent();
    agent.start().await;
    let plugin_alloc = agent.run_plugin("plugin", "hostpath", &[]).await;
    let (code, out, err) = agent.cli(&["plugin", "status"]);
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("hostpath") && out.contains("1/1"), "{out}");
    let (code, out, _) = agent.cli(&["plugin", "status", "hostpath"]);
    assert_eq!(code, 0);
    assert!(
        out.contains("hostpath.csi.berth.dev"),
        "fingerprint shown: {out}"
    );

    let spec = agent.write_file("shared.hcl", &volume_spec("shared", "hostpath"));
    let (code, out, err) = agent.cli(&["volume", "create", spec.to_str().unwrap()]);
    assert_eq!(code, 0, "{out}{err}\n{}", agent.output());
    assert!(out.contains("Created volume \"shared\""), "{out}");
    assert!(
        agent.path().join("csi-data/shared").is_dir(),
        "CreateVolume made the dir"
    );

    // B writes, then waits to be stopped.
    let writer = agent
        .run_job(
            "writer",
            &consumer_job(
                "writer",
                "service",
                "shared",
                false,
                "echo written-by-b > /vol/file; while true; do sleep 0.1; done",
            ),
        )
        .await;
    agent.wait_alloc(&writer, "running", is_running).await;
    let file = agent.path().join("csi-data/shared/file");
    let deadline = Instant::now() + Duration::from_secs(10);
    while !file.exists() {
        assert!(
            Instant::now() < deadline,
            "B never wrote through the volume"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let published: Vec<PathBuf> = agent
        .csi_mounts()
        .into_iter()
        .filter(|p| p.to_string_lossy().contains(&format!("per-alloc/{writer}")))
        .collect();
    assert_eq!(
        published.len(),
        1,
        "B's target is mounted on the host: {:?}",
        agent.csi_mounts()
    );
    let status = agent.volume("shared").await;
    assert_eq!(status.claims.len(), 1);
    assert_eq!(status.claims[0].alloc_id, writer);
    let (_, out, _) = agent.cli(&["volume", "status", "shared"]);
    assert!(
        out.contains("writer.g[0]") && out.contains("write"),
        "{out}"
    );

    // A second writer of a single-node-writer volume is refused, readably, and holds
    // nothing afterwards.
    let second = agent
        .run_job(
            "second",
            &consumer_job(
                "second",
                "batch",
                "shared",
                false,
                "echo never > /vol/other",
            ),
        )
        .await;
    agent.wait_alloc(&second, "failed", is_dead).await;
    let refusal = setup_failure(&agent.alloc(&second).await);
    assert!(
        refusal.contains("volume \"v\" (CSI volume \"shared\")")
            && refusal.contains("a second writer is refused")
            && refusal.contains("writer.g[0]"),
        "{refusal}"
    );
    assert_eq!(agent.volume("shared").await.claims.len(), 1);
    assert!(
        !agent
            .csi_mounts()
            .iter()
            .any(|p| p.to_string_lossy().contains(&second))
    );
    // Deleting a claimed volume is refused, naming who holds it; nothing is deleted.
    let (code, _, err) = agent.cli(&["volume", "delete", "shared"]);
    assert_ne!(code, 0);
    assert!(
        err.contains(&format!(
            "volume \"shared\" is claimed by alloc(s) {writer}: stop them before deleting it"
        )),
        "{err}"
    );
    assert!(agent.path().join("csi-data/shared/file").exists());

    // B stops: unpublished, unstaged, claim released, nothing left mounted.
    let (code, _, err) = agent.cli(&["job", "stop", "writer"]);
    assert_eq!(code, 0, "{err}");
    agent.wait_alloc(&writer, "stopped", is_dead).await;
    assert_eq!(
        agent.csi_mounts(),
        Vec::<PathBuf>::new(),
        "nothing left mounted"
    );
    assert!(
        agent.volume("shared").await.claims.is_empty(),
        "claim released"
    );
    let log = agent.plugin_log(&plugin_alloc);
    for rpc in [
        "ControllerPublishVolume",
        "NodeStageVolume",
        "NodePublishVolume",
        "NodeUnpublishVolume",
        "NodeUnstageVolume",
        "ControllerUnpublishVolume",
    ] {
        assert_eq!(rpc_count(&log, rpc), 1, "{rpc} once:\n{log}");
    }

    // C reads what B wrote.
    let reader = agent
        .run_job(
            "reader",
            &consumer_job("reader", "batch", "shared", true, "cat /vol/file"),
        )
        .await;
    agent.wait_alloc(&reader, "done", is_dead).await;
    assert_eq!(
        agent.alloc(&reader).await.client_status,
        ClientStatus::Complete
    );
    assert_eq!(agent.task_stdout(&reader, "t").trim(), "written-by-b");
    assert_eq!(agent.csi_mounts(), Vec::<PathBuf>::new());

    // Nobody claims it now: deleted through the plugin (its data gone) and forgotten.
    let (code, out, err) = agent.cli(&["volume", "delete", "shared"]);
    assert_eq!(code, 0, "{out}{err}");
    assert!(out.contains("Deleted volume \"shared\""), "{out}");
    assert!(!agent.path().join("csi-data/shared").exists());
    assert_eq!(
        rpc_count(&agent.plugin_log(&plugin_alloc), "DeleteVolume"),
        1
    );
    let (code, _, err) = agent.cli(&["volume", "status", "shared"]);
    assert_ne!(code, 0, "{err}");

    // The plugin job stops: deregistered, gone from plugin status, socket dir removed.
    let (code, _, _) = agent.cli(&["job", "stop", "plugin"]);
    assert_eq!(code, 0);
    agent.wait_alloc(&plugin_alloc, "stopped", is_dead).await;
    agent.wait_plugin("hostpath", "gone", |p| p.is_none()).await;
    let (_, out, _) = agent.cli(&["plugin", "status"]);
    assert!(out.contains("No CSI plugins"), "{out}");
    assert!(
        !agent
            .path()
            .join("data/csi/plugins")
            .join(&plugin_alloc)
            .exists()
    );
    assert!(
        support::host_mounts_under_besides_alloc_disks(agent.path()).is_empty(),
        "the shared CSI dir is released"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn when_the_second_volume_fails_the_first_is_fully_given_back() {
    let mut agent = agent();
    agent.start().await;
    let plugin_alloc = agent.run_plugin("plugin", "hostpath", &[]).await;
    agent.create_volume("good", "hostpath");
    // Registered, but the plugin has no such volume.
    let ghost = agent.write_file(
        "ghost.hcl",
        &volume_spec("ghost", "hostpath")
            .replace("capacity_min = \"1MiB\"", "external_id = \"ghost\""),
    );
    let (code, out, err) = agent.cli(&["volume", "register", ghost.to_str().unwrap()]);
    assert_eq!(code, 0, "{out}{err}");
    let job = r#"job "two" {
  type = "batch"
  group "g" {
    volume "a" {
      type            = "csi"
      source          = "good"
      access_mode     = "single-node-writer"
    }
    volume "b" {
      type            = "csi"
      source          = "ghost"
      access_mode     = "single-node-writer"
    }
    task "t" {
      driver = "exec"
      config {
        command = "/bin/true"
      }
      volume_mount {
        volume      = "a"
        destination = "/a"
      }
      volume_mount {
        volume      = "b"
        destination = "/b"
      }
    }
  }
}"#;
    let alloc = agent.run_job("two", job).await;
    agent.wait_alloc(&alloc, "failed", is_dead).await;
    let status = agent.alloc(&alloc).await;
    assert_eq!(status.client_status, ClientStatus::Failed);
    assert_ne!(
        status.tasks["t"]
            .events
            .iter()
            .filter(|e| e.kind == EventKind::Started)
            .count(),
        1
    );
    let message = setup_failure(&status);
    assert!(
        message.contains("volume \"b\" (CSI volume \"ghost\")")
            && message.contains("does not know this volume")
            && message.contains("volume(s) a mounted before it were given back"),
        "{message}"
    );
    assert_eq!(
        agent.csi_mounts(),
        Vec::<PathBuf>::new(),
        "the first volume is unmounted"
    );
    assert!(agent.volume("good").await.claims.is_empty());
    assert!(agent.volume("ghost").await.claims.is_empty());
    let log = agent.plugin_log(&plugin_alloc);
    for rpc in [
        "NodeUnpublishVolume",
        "NodeUnstageVolume",
        "ControllerUnpublishVolume",
    ] {
        assert_eq!(
            rpc_count(&log, rpc),
            1,
            "{rpc} for the first volume:\n{log}"
        );
    }
    let (code, out, _) = agent.cli(&["alloc", "status", &alloc[..8]]);
    assert_eq!(code, 0);
    assert!(
        out.contains("Setup Failure") && out.contains("CSI volume \"ghost\""),
        "{out}"
    );
    agent.cli(&["job", "stop", "plugin"]);
    agent.wait_alloc(&plugin_alloc, "stopped", is_dead).await;
}

/// The plugin task's pid (its root is below the agent's dir).
fn plugin_pid(agent: &AgentProcess) -> rustix::process::Pid {
    support::processes_rooted_under(agent.path())
        .into_iter()
        .find(|pid| {
            std::fs::read(format!("/proc/{}/cmdline", pid.as_raw_nonzero()))
                .is_ok_and(|c| String::from_utf8_lossy(&c).contains("csi-hostpath"))
        })
        .expect("the plugin process")
}

#[tokio::test(flavor = "multi_thread")]
async fn a_killed_plugin_becomes_unhealthy_then_healthy_and_a_stopped_one_is_deregistered() {
    let mut agent = agent();
    agent.start().await;
    let plugin_alloc = agent.run_plugin("plugin", "hostpath", &[]).await;
    let pid = plugin_pid(&agent);
    rustix::process::kill_process(pid, rustix::process::Signal::KILL).unwrap();
    agent
        .wait_alloc(&plugin_alloc, "healthy again", |a| {
            let events = events(a, "hostpath");
            let unhealthy = events.iter().position(|(k, m)| {
                *k == EventKind::PluginUnhealthy && m.contains("the plugin task exited")
            });
            unhealthy.is_some_and(|at| {
                events[at..]
                    .iter()
                    .any(|(k, _)| *k == EventKind::PluginHealthy)
            })
        })
        .await;
    agent
        .wait_plugin("hostpath", "healthy again", |p| {
            p.is_some_and(|p| p.nodes_healthy == 1)
        })
        .await;
    let status = agent.alloc(&plugin_alloc).await;
    let kinds: Vec<EventKind> = status.tasks["hostpath"]
        .events
        .iter()
        .map(|e| e.kind)
        .collect();
    assert_eq!(
        kinds
            .iter()
            .filter(|k| **k == EventKind::PluginHealthy)
            .count(),
        2,
        "events only on health changes: {kinds:?}"
    );
    assert_eq!(status.tasks["hostpath"].restarts, 1);
    let (code, _, _) = agent.cli(&["job", "stop", "plugin"]);
    assert_eq!(code, 0);
    agent.wait_alloc(&plugin_alloc, "stopped", is_dead).await;
    agent.wait_plugin("hostpath", "gone", |p| p.is_none()).await;
    assert!(
        !agent
            .path()
            .join("data/csi/plugins")
            .join(&plugin_alloc)
            .exists()
    );
    assert!(support::processes_rooted_under(agent.path()).is_empty());
}

#[tokio::test(flavor = "multi_thread")]
async fn after_kill_9_of_the_agent_the_volume_stays_and_is_unstaged_exactly_once() {
    let mut agent = agent();
    agent.start().await;
    let plugin_alloc = agent.run_plugin("plugin", "hostpath", &[]).await;
    agent.create_volume("kept", "hostpath");
    let b = agent
        .run_job(
            "b",
            &consumer_job(
                "b",
                "service",
                "kept",
                false,
                "n=0; while true; do n=$((n+1)); echo $n > /vol/count; sleep 0.05; done",
            ),
        )
        .await;
    agent.wait_alloc(&b, "running", is_running).await;
    let mounts_before = agent.csi_mounts();
    assert_eq!(
        mounts_before.len(),
        2,
        "staging + target: {mounts_before:?}"
    );

    agent.kill9();
    agent.start().await;
    agent
        .wait_plugin("hostpath", "healthy after the restart", |p| {
            p.is_some_and(|p| p.nodes_healthy == 1 && p.controllers_healthy == 1)
        })
        .await;
    agent.wait_alloc(&b, "running", is_running).await;
    assert_eq!(
        agent.csi_mounts(),
        mounts_before,
        "same mounts, nothing mounted twice"
    );
    // B still writes through its volume.
    let count = agent.path().join("csi-data/kept/count");
    let first = std::fs::read_to_string(&count).unwrap();
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_ne!(
        std::fs::read_to_string(&count).unwrap(),
        first,
        "B keeps writing"
    );
    let log = agent.plugin_log(&plugin_alloc);
    assert_eq!(rpc_count(&log, "NodeStageVolume"), 1, "{log}");
    assert_eq!(rpc_count(&log, "NodePublishVolume"), 1, "{log}");

    let (code, _, _) = agent.cli(&["job", "stop", "b"]);
    assert_eq!(code, 0);
    agent.wait_alloc(&b, "stopped", is_dead).await;
    let log = agent.plugin_log(&plugin_alloc);
    assert_eq!(rpc_count(&log, "NodeUnpublishVolume"), 1, "{log}");
    assert_eq!(rpc_count(&log, "NodeUnstageVolume"), 1, "{log}");
    assert_eq!(agent.csi_mounts(), Vec::<PathBuf>::new());
    assert!(agent.volume("kept").await.claims.is_empty());
    agent.cli(&["job", "stop", "plugin"]);
    agent.wait_alloc(&plugin_alloc, "stopped", is_dead).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn bad_csi_input_gets_clear_errors() {
    let mut agent = agent();
    agent.start().await;
    // A driver that cannot mount, given a CSI volume; and an unknown access mode.
    let job = r#"job "raw" {
  group "g" {
    volume "v" {
      type        = "csi"
      source      = "nowhere"
      access_mode = "single-node-scribbler"
    }
    task "t" {
      driver = "raw_exec"
      config {
        command = "/bin/true"
      }
      volume_mount {
        volume      = "v"
        destination = "/vol"
      }
    }
  }
}"#;
    let path = agent.write_file("raw.hcl", job);
    let (code, _, err) = agent.cli(&["job", "run", path.to_str().unwrap()]);
    assert_eq!(code, 2, "{err}");
    assert!(
        err.contains(
            "driver \"raw_exec\" cannot mount volumes, but volume_mount \"v\" asks for one"
        ),
        "{err}"
    );
    assert!(
        err.contains("unknown access mode \"single-node-scribbler\""),
        "{err}"
    );
    assert!(
        err.contains("no CSI volume \"nowhere\" is registered"),
        "{err}"
    );
    // A volume for a plugin this agent does not run.
    let spec = agent.write_file("v.hcl", &volume_spec("v", "nope"));
    let (code, _, err) = agent.cli(&["volume", "create", spec.to_str().unwrap()]);
    assert_eq!(code, 2);
    assert!(
        err.contains("no CSI plugin \"nope\" is registered"),
        "{err}"
    );
    // A spec with an unknown access mode names the line.
    let bad = agent.write_file(
        "bad.hcl",
        &volume_spec("v", "nope").replace("single-node-writer", "everyone"),
    );
    let (code, _, err) = agent.cli(&["volume", "register", bad.to_str().unwrap()]);
    assert_eq!(code, 2);
    assert!(
        err.contains("unknown access mode \"everyone\"") && err.contains("bad.hcl:7:"),
        "{err}"
    );
    let (code, out, _) = agent.cli(&["volume", "status"]);
    assert_eq!(code, 0);
    assert!(out.contains("No CSI volumes"), "{out}");
}

#[tokio::test(flavor = "multi_thread")]
async fn misbehaving_plugins_hit_deadlines_and_leak_no_mount_or_claim() {
    let mut agent = agent();
    agent.start().await;
    // Never creates its socket / answers garbage: restarted after health_timeout, with
    // the reason.
    let silent = agent
        .run_job(
            "silent",
            &plugin_job("silent", "silent", &["--no-socket"], "1s"),
        )
        .await;
    let garbage = agent
        .run_job(
            "garbage",
            &plugin_job("garbage", "garbage", &["--garbage"], "1s"),
        )
        .await;
    for (alloc, why) in [
        (&silent, "has not created its socket"),
        (&garbage, "did not become healthy"),
    ] {
        agent
            .wait_alloc(alloc, "restarted", |a| {
                events(a, "hostpath")
                    .iter()
                    .any(|(k, m)| *k == EventKind::RestartSignaled && m.contains(why))
            })
            .await;
    }
    let garbage_status = agent.alloc(&garbage).await;
    let reason = events(&garbage_status, "hostpath")
        .into_iter()
        .find(|(k, _)| *k == EventKind::RestartSignaled)
        .unwrap()
        .1;
    assert!(
        reason.contains("CSI plugin \"garbage\": Probe failed"),
        "{reason}"
    );
    assert!(
        agent
            .plugin("silent")
            .await
            .is_none_or(|p| p.nodes_healthy == 0)
    );
    agent.cli(&["job", "stop", "silent"]);
    agent.cli(&["job", "stop", "garbage"]);

    // Hangs in NodePublishVolume: the alloc fails within the operation deadline and the
    // staged volume is unstaged again.
    let hang_alloc = agent
        .run_plugin("hang", "hang", &["--hang", "NodePublishVolume"])
        .await;
    agent.create_volume("h", "hang");
    let started = Instant::now();
    let consumer = agent
        .run_job("hc", &consumer_job("hc", "batch", "h", false, "true"))
        .await;
    agent.wait_alloc(&consumer, "failed", is_dead).await;
    assert!(
        started.elapsed() < Duration::from_secs(15),
        "{:?}",
        started.elapsed()
    );
    let message = setup_failure(&agent.alloc(&consumer).await);
    assert!(
        message.contains("NodePublishVolume") && message.contains("did not answer in time"),
        "{message}"
    );
    assert_eq!(
        agent.csi_mounts(),
        Vec::<PathBuf>::new(),
        "unstaged after the hang"
    );
    assert!(agent.volume("h").await.claims.is_empty());
    assert_eq!(
        rpc_count(&agent.plugin_log(&hang_alloc), "NodeUnstageVolume"),
        1
    );

    // Dies in NodePublishVolume: the alloc fails; once the plugin is back (restarted by
    // its restart policy) the stage is undone too.
    let die_alloc = agent
        .run_plugin("die", "die", &["--die", "NodePublishVolume"])
        .await;
    agent.create_volume("d", "die");
    let consumer = agent
        .run_job("dc", &consumer_job("dc", "batch", "d", false, "true"))
        .await;
    agent.wait_alloc(&consumer, "failed", is_dead).await;
    let message = setup_failure(&agent.alloc(&consumer).await);
    assert!(message.contains("NodePublishVolume"), "{message}");
    // The undo may not have reached the dead plugin; then the agent finishes it once
    // the plugin is healthy again.
    let deadline = Instant::now() + Duration::from_secs(20);
    while !agent.csi_mounts().is_empty() {
        assert!(
            Instant::now() < deadline,
            "the stage was never undone: {:?}\n{}",
            agent.csi_mounts(),
            agent.output()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(agent.volume("d").await.claims.is_empty());
    assert_eq!(
        rpc_count(&agent.plugin_log(&die_alloc), "NodeUnstageVolume"),
        1
    );

    for job in ["hang", "die"] {
        agent.cli(&["job", "stop", job]);
    }
    for alloc in [&silent, &garbage, &hang_alloc, &die_alloc] {
        agent.wait_alloc(alloc, "stopped", is_dead).await;
    }
    assert!(support::host_mounts_under_besides_alloc_disks(agent.path()).is_empty());
}

/// One alloc uses one volume read-write in one place and read-only in another: the CSI
/// spec has one staging path per volume per node, so the volume is staged once and
/// published twice, each with its own readonly flag; it is unstaged once, after both
/// publications are gone. The plugin refuses a second staging path, as strict ones do.
#[tokio::test(flavor = "multi_thread")]
async fn a_volume_used_twice_by_one_alloc_is_staged_once_and_published_twice() {
    let mut agent = agent();
    agent.start().await;
    let plugin_alloc = agent.run_plugin("plugin", "hostpath", &[]).await;
    let spec = agent.write_file("twice.hcl", &volume_spec("twice", "hostpath"));
    let (code, out, err) = agent.cli(&["volume", "create", spec.to_str().unwrap()]);
    assert_eq!(code, 0, "{out}{err}");
    let job = r#"job "both" {
  type = "batch"
  group "g" {
    volume "rw" {
      type            = "csi"
      source          = "twice"
      access_mode     = "single-node-writer"
      attachment_mode = "file-system"
    }
    volume "ro" {
      type            = "csi"
      source          = "twice"
      access_mode     = "single-node-writer"
      attachment_mode = "file-system"
      read_only       = true
    }
    restart {
      attempts = 0
      mode     = "fail"
    }
    task "t" {
      driver = "exec"
      config {
        command = "/bin/sh"
        args    = ["-c", "echo hello > /rw/file && cat /ro/file && if echo no > /ro/other 2>/dev/null; then echo WROTE-RO; else echo ro-refused; fi"]
      }
      volume_mount {
        volume      = "rw"
        destination = "/rw"
      }
      volume_mount {
        volume      = "ro"
        destination = "/ro"
      }
    }
  }
}
"#;
    let alloc = agent.run_job("both.hcl", job).await;
    agent.wait_alloc(&alloc, "finished", is_dead).await;
    let status = agent.alloc(&alloc).await;
    assert_eq!(
        status.client_status,
        ClientStatus::Complete,
        "{status:#?}\n{}",
        agent.plugin_log(&plugin_alloc)
    );
    assert_eq!(agent.task_stdout(&alloc, "t"), "hello\nro-refused\n");
    let log = agent.plugin_log(&plugin_alloc);
    assert_eq!(rpc_count(&log, "NodeStageVolume"), 1, "{log}");
    assert_eq!(rpc_count(&log, "NodePublishVolume"), 2, "{log}");
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let log = agent.plugin_log(&plugin_alloc);
        if rpc_count(&log, "NodeUnstageVolume") == 1 && agent.csi_mounts().is_empty() {
            assert_eq!(rpc_count(&log, "NodeUnpublishVolume"), 2, "{log}");
            break;
        }
        assert!(
            Instant::now() < deadline,
            "not given back: {log}\n{:?}",
            agent.csi_mounts()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// The plugin is gone when a volume's user stops: the volume cannot be unpublished, so
/// the claim and the mounts stay (nothing is pulled from under the plugin's feet), and
/// giving them back is retried, across an agent restart, until the plugin is back.
#[tokio::test(flavor = "multi_thread")]
async fn a_volume_whose_plugin_is_down_is_given_back_once_the_plugin_returns() {
    let mut agent = agent();
    agent.start().await;
    agent.run_plugin("plugin", "hostpath", &[]).await;
    agent.create_volume("stuck", "hostpath");
    let user = agent
        .run_job(
            "user",
            &consumer_job(
                "user",
                "service",
                "stuck",
                false,
                "while true; do sleep 0.1; done",
            ),
        )
        .await;
    agent.wait_alloc(&user, "running", is_running).await;
    assert_eq!(agent.csi_mounts().len(), 2);

    assert_eq!(agent.cli(&["job", "stop", "plugin"]).0, 0);
    agent.wait_plugin("hostpath", "gone", |p| p.is_none()).await;
    assert_eq!(agent.cli(&["job", "stop", "user"]).0, 0);
    agent.wait_alloc(&user, "stopped", is_dead).await;
    let status = agent.volume("stuck").await;
    assert_eq!(status.claims.len(), 1, "still claimed");
    assert_eq!(agent.csi_mounts().len(), 2, "still mounted");
    assert_eq!(
        status.releasing.get(&user).map(String::as_str),
        Some("releasing (waiting for plugin \"hostpath\")"),
        "{status:#?}"
    );
    let on_node = status.on_node.expect("staged and published here");
    assert_eq!(
        on_node.staged.as_deref(),
        Some("file-system/single-node-writer")
    );
    assert_eq!(on_node.publications.len(), 1);
    assert_eq!(on_node.publications[0].alloc_id, user);
    let (code, shown, _) = agent.cli(&["volume", "status", "stuck"]);
    assert_eq!(code, 0);
    assert!(
        shown.contains("releasing (waiting for plugin \"hostpath\")")
            && shown.contains("Staged          = file-system/single-node-writer"),
        "{shown}"
    );

    // The retries outlive the agent: its successor resumes them from the state file.
    agent.kill9();
    agent.start().await;
    let plugin_alloc = agent.run_plugin("plugin", "hostpath", &[]).await;
    let deadline = Instant::now() + Duration::from_secs(60);
    while !(agent.volume("stuck").await.claims.is_empty() && agent.csi_mounts().is_empty()) {
        assert!(
            Instant::now() < deadline,
            "never given back: {:?}\n{}",
            agent.csi_mounts(),
            agent.output()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let log = agent.plugin_log(&plugin_alloc);
    assert_eq!(rpc_count(&log, "NodeUnpublishVolume"), 1, "{log}");
    assert_eq!(rpc_count(&log, "NodeUnstageVolume"), 1, "{log}");
}

/// Makes the plugin hold on after `rpc` has done its work, before it answers.
fn pause_plugin_after(agent: &AgentProcess, rpc: &str) {
    std::fs::write(agent.path().join("csi-data/.pause-after"), rpc).unwrap();
}

/// Once the plugin holds after `rpc`, kills the agent (the worst moment: the plugin
/// acted, the agent never heard), lets the plugin go and starts the agent again.
async fn kill_agent_when_paused(agent: &mut AgentProcess, rpc: &str) {
    let paused = agent.path().join("csi-data/.paused");
    let deadline = Instant::now() + Duration::from_secs(30);
    while !paused.exists() {
        assert!(
            Instant::now() < deadline,
            "the plugin never reached {rpc}\n{}",
            agent.output()
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    agent.kill9();
    std::fs::remove_file(&paused).unwrap();
    agent.start().await;
}

/// No crash point of a volume's mount or release leaves a mount berth does not know of,
/// a stage twice, a claim without a mount, or a call out of the spec's order: the agent
/// is killed right after each RPC has acted (before it hears the answer), and what its
/// successor does converges.
#[tokio::test(flavor = "multi_thread")]
async fn a_kill_9_right_after_any_csi_call_converges_with_no_leaked_mount_or_double_stage() {
    let mut agent = agent();
    agent.start().await;
    let plugin_alloc = agent.run_plugin("plugin", "hostpath", &[]).await;
    agent.create_volume("crashy", "hostpath");
    let staged_dir = agent.path().join("csi-data/.staged");
    let published_file = agent.path().join("csi-data/.published/crashy");
    let script = "while true; do date +%s%N > /vol/alive; sleep 0.05; done";

    for (round, rpc) in [
        "ControllerPublishVolume",
        "NodeStageVolume",
        "NodePublishVolume",
        "NodeUnpublishVolume",
        "NodeUnstageVolume",
        "ControllerUnpublishVolume",
    ]
    .into_iter()
    .enumerate()
    {
        let job = format!("user{round}");
        let source = consumer_job(&job, "service", "crashy", false, script);
        let mounting =
            rpc.contains("Publish") && !rpc.contains("Unpublish") || rpc == "NodeStageVolume";
        let publishes_before = rpc_count(&agent.plugin_log(&plugin_alloc), "NodePublishVolume");
        let alloc = if mounting {
            pause_plugin_after(&agent, rpc);
            let alloc = agent.run_job(&job, &source).await;
            kill_agent_when_paused(&mut agent, rpc).await;
            agent.wait_alloc(&alloc, "running", is_running).await;
            assert_eq!(
                agent.csi_mounts().len(),
                2,
                "after a crash in {rpc}: one stage and one publication, nothing twice"
            );
            alloc
        } else {
            let alloc = agent.run_job(&job, &source).await;
            agent.wait_alloc(&alloc, "running", is_running).await;
            pause_plugin_after(&agent, rpc);
            assert_eq!(agent.cli(&["job", "stop", &job]).0, 0);
            kill_agent_when_paused(&mut agent, rpc).await;
            alloc
        };
        if mounting {
            assert_eq!(agent.cli(&["job", "stop", &job]).0, 0);
        }
        agent.wait_alloc(&alloc, "stopped", is_dead).await;
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let volume = agent.volume("crashy").await;
            let released = volume.claims.is_empty() && volume.on_node.is_none();
            if released && agent.csi_mounts().is_empty() {
                break;
            }
            assert!(
                Instant::now() < deadline,
                "after a crash in {rpc}, never given back: {volume:#?} {:?}\n{}",
                agent.csi_mounts(),
                agent.output()
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        assert!(
            std::fs::read_dir(&staged_dir).map_or(true, |d| d.count() == 0),
            "after a crash in {rpc}, the plugin still has a stage"
        );
        assert!(
            !published_file.exists(),
            "after a crash in {rpc}, the plugin still has a publication"
        );
        let log = agent.plugin_log(&plugin_alloc);
        assert!(
            log.contains(&format!("paused after {rpc}, as asked")),
            "the agent was killed in {rpc}:\n{log}"
        );
        assert!(
            !log.contains("SPEC VIOLATION"),
            "after a crash in {rpc}:\n{log}"
        );
        if !mounting {
            assert_eq!(
                rpc_count(&log, "NodePublishVolume"),
                publishes_before + 1,
                "a stopping alloc is not mounted again after a crash in {rpc}:\n{log}"
            );
        }
    }
    agent.cli(&["job", "stop", "plugin"]);
    agent.wait_alloc(&plugin_alloc, "stopped", is_dead).await;
}

/// A NodePublishVolume whose deadline passes after the plugin has mounted: the outcome
/// is unknown, so berth unpublishes before it unstages (the spec's order) and leaves no
/// mount behind.
#[tokio::test(flavor = "multi_thread")]
async fn a_publish_that_times_out_after_the_plugin_acted_is_unpublished_before_the_unstage() {
    let mut agent = agent();
    agent.start().await;
    let plugin_alloc = agent.run_plugin("plugin", "hostpath", &[]).await;
    agent.create_volume("slow", "hostpath");
    let data = agent.path().join("csi-data");
    std::fs::write(data.join(".pause-after"), "NodePublishVolume always").unwrap();
    let alloc = agent
        .run_job(
            "user",
            &consumer_job("user", "batch", "slow", false, "echo never"),
        )
        .await;
    agent.wait_alloc(&alloc, "failed", is_dead).await;
    let message = setup_failure(&agent.alloc(&alloc).await);
    assert!(message.contains("NodePublishVolume"), "{message}");
    std::fs::remove_file(data.join(".pause-after")).unwrap();
    let _ = std::fs::remove_file(data.join(".paused"));
    assert_eq!(agent.csi_mounts(), Vec::<PathBuf>::new());
    let status = agent.volume("slow").await;
    assert!(
        status.claims.is_empty() && status.on_node.is_none(),
        "{status:#?}"
    );
    let log = agent.plugin_log(&plugin_alloc);
    assert!(!log.contains("SPEC VIOLATION"), "{log}");
    assert!(!data.join(".published/slow").exists(), "{log}");
    // The undo reached the plugin, each call once and in the spec's order: after the
    // last publish the plugin made (its answer never heard), the publication
    // unpublished, then the stage unstaged, then the volume unpublished from the node
    // by the controller.
    let lines_of = |what: &str| -> Vec<usize> {
        log.lines()
            .enumerate()
            .filter(|(_, l)| l.starts_with(what))
            .map(|(i, _)| i)
            .collect()
    };
    let line_of = |what: &str| {
        let lines = lines_of(what);
        assert_eq!(lines.len(), 1, "{what:?} once:\n{log}");
        lines[0]
    };
    let published = *lines_of("paused after NodePublishVolume")
        .last()
        .unwrap_or_else(|| panic!("the plugin never published:\n{log}"));
    let unpublished = line_of("NodeUnpublishVolume ");
    let unstaged = line_of("NodeUnstageVolume ");
    let detached = line_of("ControllerUnpublishVolume ");
    assert!(
        published < unpublished && unpublished < unstaged && unstaged < detached,
        "out of order:\n{log}"
    );
    agent.cli(&["job", "stop", "plugin"]);
    agent.wait_alloc(&plugin_alloc, "stopped", is_dead).await;
}

/// A volume whose name and external id a token holder filled with terminal escapes (an
/// OSC 52 clipboard write, BEL, a forged line, a bidi override, C1's CSI):
/// `volume status` shows them escaped, so the operator's terminal gets no control
/// character but our own line breaks and tabs.
#[tokio::test(flavor = "multi_thread")]
async fn volume_status_of_a_hostile_name_prints_no_control_character() {
    let mut agent = agent();
    agent.start().await;
    let plugin_alloc = agent.run_plugin("plugin", "hostpath", &[]).await;
    let hostile = "evil\u{1b}]52;c;aGk=\u{7}\r\nforged line\u{202e}txt.exe\u{9b}2J";
    let spec = volume_spec("hostile", "hostpath").replace(
        "name      = \"hostile\"",
        &format!("name      = {}", serde_json::to_string(hostile).unwrap()),
    );
    let spec = agent.write_file("hostile.hcl", &spec);
    let (code, out, err) = agent.cli(&["volume", "create", spec.to_str().unwrap()]);
    assert_eq!(code, 0, "{out}{err}");
    let (code, out, err) = agent.cli(&["volume", "status", "hostile"]);
    assert_eq!(code, 0, "{out}{err}");
    assert!(out.contains("evil"), "{out}");
    let bad: Vec<char> = format!("{out}{err}")
        .chars()
        .filter(|&c| {
            (c.is_control() && c != '\n' && c != '\t')
                || matches!(c, '\u{202a}'..='\u{202e}' | '\u{2066}'..='\u{2069}')
        })
        .collect();
    assert!(
        bad.is_empty(),
        "control characters {bad:?} reached the terminal:\n{out}"
    );
    assert!(!out.lines().any(|l| l.starts_with("forged line")), "{out}");
    agent.cli(&["job", "stop", "plugin"]);
    agent.wait_alloc(&plugin_alloc, "stopped", is_dead).await;
}

/// A plugin that binds the target, then fails NodePublishVolume (a real plugin whose
/// `bind,remount` was refused keeps its first bind): the failed publish is undone like
/// one whose outcome is unknown, so nothing stays mounted once the alloc failed.
#[tokio::test(flavor = "multi_thread")]
async fn a_publish_that_fails_after_its_bind_leaves_no_mount() {
    let mut agent = agent();
    agent.start().await;
    let plugin_alloc = agent.run_plugin("plugin", "hostpath", &[]).await;
    agent.create_volume("half", "hostpath");
    let data = agent.path().join("csi-data");
    std::fs::write(data.join(".keep-failed-bind"), "").unwrap();
    let alloc = agent
        .run_job(
            "user",
            &consumer_job("user", "batch", "half", false, "echo never"),
        )
        .await;
    agent.wait_alloc(&alloc, "failed", is_dead).await;
    let message = setup_failure(&agent.alloc(&alloc).await);
    assert!(
        message.contains("permission denied (the bind stays)"),
        "{message}"
    );
    assert_eq!(agent.csi_mounts(), Vec::<PathBuf>::new());
    let log = agent.plugin_log(&plugin_alloc);
    assert_eq!(rpc_count(&log, "NodeUnpublishVolume"), 1, "{log}");
    assert!(!log.contains("SPEC VIOLATION"), "{log}");
    let status = agent.volume("half").await;
    assert!(
        status.claims.is_empty() && status.on_node.is_none(),
        "{status:#?}"
    );
    agent.cli(&["job", "stop", "plugin"]);
    agent.wait_alloc(&plugin_alloc, "stopped", is_dead).await;
}

/// Snapshots through the plugin's controller (CreateSnapshot idempotent by name,
/// ListSnapshots, DeleteSnapshot), and a volume in use expanded by raising its
/// capacity_min: ControllerExpandVolume, then NodeExpandVolume where it is published;
/// never shrunk.
#[tokio::test(flavor = "multi_thread")]
async fn snapshots_are_taken_listed_and_deleted_and_a_volume_in_use_is_expanded() {
    let mut agent = agent();
    agent.start().await;
    let plugin_alloc = agent.run_plugin("plugin", "hostpath", &[]).await;
    agent.create_volume("data", "hostpath");
    let data = agent.path().join("csi-data");
    std::fs::write(data.join("data/note"), "kept\n").unwrap();

    for _ in 0..2 {
        // The same name twice is the same snapshot, as the spec has it.
        let (code, out, err) =
            agent.cli(&["volume", "snapshot", "create", "data", "before-upgrade"]);
        assert_eq!(code, 0, "{out}{err}");
        assert!(
            out.contains(
                "Snapshot \"before-upgrade\" of volume \"data\" created by plugin \"hostpath\""
            ),
            "{out}"
        );
    }
    assert_eq!(
        std::fs::read_to_string(data.join(".snapshots/before-upgrade/note")).unwrap(),
        "kept\n"
    );
    let listed: Vec<berth_model::csi::SnapshotInfo> = agent
        .client()
        .get("/v1/berth/volumes/snapshot?plugin_id=hostpath")
        .await
        .unwrap();
    assert_eq!(listed.len(), 1, "{listed:?}");
    assert_eq!(
        (
            listed[0].snapshot_id.as_str(),
            listed[0].source_volume_id.as_str()
        ),
        ("before-upgrade", "data")
    );
    assert!(listed[0].ready_to_use && listed[0].size_bytes == 5 && listed[0].created_at > 0);
    let (code, out, _) = agent.cli(&["volume", "snapshot", "list", "-plugin", "hostpath"]);
    assert_eq!(code, 0);
    assert!(
        out.contains("before-upgrade") && out.contains("data"),
        "{out}"
    );
    let (code, out, err) =
        agent.cli(&["volume", "snapshot", "delete", "hostpath", "before-upgrade"]);
    assert_eq!(code, 0, "{out}{err}");
    assert!(!data.join(".snapshots/before-upgrade").exists());
    let (_, out, _) = agent.cli(&["volume", "snapshot", "list"]);
    assert_eq!(out.trim(), "No snapshots");

    // Expanded while an alloc uses it.
    let user = agent
        .run_job(
            "user",
            &consumer_job(
                "user",
                "service",
                "data",
                false,
                "while true; do sleep 0.1; done",
            ),
        )
        .await;
    agent.wait_alloc(&user, "running", is_running).await;
    let bigger = agent.write_file(
        "bigger.hcl",
        &volume_spec("data", "hostpath").replace("\"1MiB\"", "\"2MiB\""),
    );
    let (code, out, err) = agent.cli(&["volume", "create", bigger.to_str().unwrap()]);
    assert_eq!(code, 0, "{out}{err}");
    assert!(
        out.contains(
            "Expanded volume \"data\" (plugin \"hostpath\") from 1048576 to 2097152 bytes"
        ),
        "{out}"
    );
    assert_eq!(agent.volume("data").await.volume.capacity_bytes, 2_097_152);
    let log = agent.plugin_log(&plugin_alloc);
    assert_eq!(rpc_count(&log, "ControllerExpandVolume"), 1, "{log}");
    assert_eq!(rpc_count(&log, "NodeExpandVolume"), 1, "{log}");
    assert!(
        log.contains(&format!("path=/local/csi/per-alloc/{user}/data/")),
        "NodeExpandVolume at the publication: {log}"
    );
    // Never shrunk: refused with both sizes, and nothing is called.
    let smaller = agent.write_file("smaller.hcl", &volume_spec("data", "hostpath"));
    let (code, _, err) = agent.cli(&["volume", "create", smaller.to_str().unwrap()]);
    assert_eq!(code, 2);
    assert!(
        err.contains(
            "volume \"data\" has 2097152 bytes and asks for 1048576: CSI volumes are expanded, \
             never shrunk"
        ),
        "{err}"
    );
    assert_eq!(
        rpc_count(&agent.plugin_log(&plugin_alloc), "ControllerExpandVolume"),
        1
    );
    agent.cli(&["job", "stop", "user"]);
    agent.wait_alloc(&user, "stopped", is_dead).await;
    agent.cli(&["job", "stop", "plugin"]);
    agent.wait_alloc(&plugin_alloc, "stopped", is_dead).await;
}

/// A plugin whose controller cannot take snapshots: refused, naming the plugin, the
/// capability and the volume; nothing is called.
#[tokio::test(flavor = "multi_thread")]
async fn snapshots_of_a_plugin_without_the_capability_are_refused_by_name() {
    let mut agent = agent();
    agent.start().await;
    let plugin_alloc = agent
        .run_plugin("plugin", "hostpath", &["--no-snapshots"])
        .await;
    agent.create_volume("plain", "hostpath");
    let (code, _, err) = agent.cli(&["volume", "snapshot", "create", "plain"]);
    assert_eq!(code, 2);
    assert!(
        err.contains(
            "CSI plugin \"hostpath\" cannot take snapshots (its controller lacks \
             CREATE_DELETE_SNAPSHOT); volume \"plain\" is unchanged"
        ),
        "{err}"
    );
    let (code, _, err) = agent.cli(&["volume", "snapshot", "list", "-plugin", "hostpath"]);
    assert_eq!(code, 2);
    assert!(
        err.contains("cannot list snapshots (its controller lacks LIST_SNAPSHOTS)"),
        "{err}"
    );
    let (code, _, err) = agent.cli(&["volume", "snapshot", "list", "-plugin", "nope"]);
    assert_eq!(code, 2, "{err}");
    let log = agent.plugin_log(&plugin_alloc);
    assert_eq!(rpc_count(&log, "CreateSnapshot"), 0, "{log}");
    agent.cli(&["job", "stop", "plugin"]);
    agent.wait_alloc(&plugin_alloc, "stopped", is_dead).await;
}

/// An operator who gives up on a plugin that is gone for good: `volume detach` says why
/// it waits, `-force` unmounts the volume here and releases the claims without the
/// plugin, and the give-back stops; a running alloc's volume is never detached.
#[tokio::test(flavor = "multi_thread")]
async fn a_forced_detach_gives_up_on_a_gone_plugin_but_never_takes_a_running_allocs_volume() {
    let mut agent = agent();
    agent.start().await;
    agent.run_plugin("plugin", "hostpath", &[]).await;
    agent.create_volume("orphan", "hostpath");
    let script = "while true; do sleep 0.1; done";
    let user = agent
        .run_job(
            "user",
            &consumer_job("user", "service", "orphan", false, script),
        )
        .await;
    agent.wait_alloc(&user, "running", is_running).await;
    let (code, _, err) = agent.cli(&["volume", "detach", "-force", "orphan"]);
    assert_eq!(code, 2);
    assert!(
        err.contains("volume \"orphan\" is in use by running alloc(s)")
            && err.contains("a detach never takes a volume from a running alloc"),
        "{err}"
    );
    assert_eq!(agent.csi_mounts().len(), 2);

    assert_eq!(agent.cli(&["job", "stop", "plugin"]).0, 0);
    agent.wait_plugin("hostpath", "gone", |p| p.is_none()).await;
    assert_eq!(agent.cli(&["job", "stop", "user"]).0, 0);
    agent.wait_alloc(&user, "stopped", is_dead).await;
    let (code, _, err) = agent.cli(&["volume", "detach", "orphan"]);
    assert_eq!(code, 2);
    assert!(
        err.contains("releasing (waiting for plugin \"hostpath\")")
            && err.contains("`berth volume detach -force orphan` gives up on the plugin"),
        "{err}"
    );
    assert_eq!(agent.csi_mounts().len(), 2, "nothing done without -force");

    let (code, out, err) = agent.cli(&["volume", "detach", "-force", "orphan"]);
    assert_eq!(code, 0, "{out}{err}");
    assert!(
        out.contains("Detached volume \"orphan\" without its plugin"),
        "{out}"
    );
    assert_eq!(agent.csi_mounts(), Vec::<PathBuf>::new());
    let status = agent.volume("orphan").await;
    assert!(
        status.claims.is_empty() && status.on_node.is_none() && status.releasing.is_empty(),
        "{status:#?}"
    );
    // The give-back has stopped: a plugin that returns is asked for nothing.
    let plugin_alloc = agent.run_plugin("plugin2", "hostpath", &[]).await;
    tokio::time::sleep(Duration::from_secs(3)).await;
    let log = agent.plugin_log(&plugin_alloc);
    assert_eq!(rpc_count(&log, "NodeUnpublishVolume"), 0, "{log}");
    // And the volume is usable again.
    let next = agent
        .run_job(
            "next",
            &consumer_job("next", "batch", "orphan", false, "ls /vol"),
        )
        .await;
    agent.wait_alloc(&next, "done", is_dead).await;
    assert_eq!(
        agent.alloc(&next).await.client_status,
        ClientStatus::Complete
    );
    agent.cli(&["job", "stop", "plugin2"]);
    agent.wait_alloc(&plugin_alloc, "stopped", is_dead).await;
}

/// A volume created where its plugin says it is accessible (`zone=a`) is refused on a
/// node its plugin now puts elsewhere (`zone=b`), saying both.
#[tokio::test(flavor = "multi_thread")]
async fn a_volume_is_refused_on_a_node_outside_its_accessible_topology() {
    let mut agent = agent();
    agent.start().await;
    let zone_a = agent
        .run_plugin("plugin-a", "hostpath", &["--topology", "zone=a"])
        .await;
    agent.create_volume("zonal", "hostpath");
    let volume = agent.volume("zonal").await.volume;
    assert_eq!(
        volume.accessible_topology,
        [std::collections::BTreeMap::from([(
            "zone".to_string(),
            "a".to_string()
        )])]
    );
    assert_eq!(agent.cli(&["job", "stop", "plugin-a"]).0, 0);
    agent.wait_alloc(&zone_a, "stopped", is_dead).await;
    agent.wait_plugin("hostpath", "gone", |p| p.is_none()).await;
    let zone_b = agent
        .run_plugin("plugin-b", "hostpath", &["--topology", "zone=b"])
        .await;
    let user = agent
        .run_job(
            "user",
            &consumer_job("user", "batch", "zonal", false, "true"),
        )
        .await;
    agent.wait_alloc(&user, "failed", is_dead).await;
    let message = setup_failure(&agent.alloc(&user).await);
    assert!(
        message.contains(
            "volume \"zonal\" is accessible from {zone=a} only, and CSI plugin \"hostpath\" \
             puts this node at {zone=b}"
        ),
        "{message}"
    );
    assert_eq!(agent.csi_mounts(), Vec::<PathBuf>::new());
    assert!(agent.volume("zonal").await.claims.is_empty());
    let log = agent.plugin_log(&zone_b);
    assert_eq!(rpc_count(&log, "NodeStageVolume"), 0, "{log}");
    agent.cli(&["job", "stop", "plugin-b"]);
    agent.wait_alloc(&zone_b, "stopped", is_dead).await;
}

/// `(status, JSON body or the plain text as a JSON string)` of one request on a dev
/// agent's open TCP listener, as a Nomad client sends it.
fn nomad(agent: &AgentProcess, method: &str, path: &str, body: &str) -> (u16, serde_json::Value) {
    let (status, _, text) = crate::nomad_api::http(agent.port(), method, path, "", body);
    let value = serde_json::from_str(&text).unwrap_or(serde_json::Value::String(text));
    (status, value)
}

/// CSI storage through Nomad's paths and shapes: the plugin read and listed, a volume
/// created and one registered, bad input refused whole (nothing half-registered), a
/// claimed volume kept from deregistration (forced or not) until its alloc stops, then
/// deregistered.
#[tokio::test(flavor = "multi_thread")]
async fn csi_volumes_and_plugins_through_nomads_api() {
    let mut agent = agent();
    agent.start().await;
    let plugin_alloc = agent.run_plugin("plugin", "hostpath", &[]).await;

    let (status, plugins) = nomad(&agent, "GET", "/v1/plugins?type=csi", "");
    assert_eq!(status, 200, "{plugins}");
    assert_eq!(plugins[0]["ID"], "hostpath", "{plugins}");
    assert_eq!(plugins[0]["Provider"], "hostpath.csi.berth.dev");
    assert_eq!(
        (
            &plugins[0]["NodesHealthy"],
            &plugins[0]["ControllersHealthy"]
        ),
        (&serde_json::json!(1), &serde_json::json!(1))
    );
    let (status, plugin) = nomad(&agent, "GET", "/v1/plugin/csi/hostpath", "");
    assert_eq!(status, 200, "{plugin}");
    let node = plugin["Nodes"]
        .as_object()
        .unwrap()
        .values()
        .next()
        .unwrap();
    assert_eq!(node["Healthy"], true, "{plugin}");
    assert_eq!(node["AllocID"], plugin_alloc.as_str());
    assert_eq!(plugin["Allocations"][0]["ID"], plugin_alloc.as_str());
    assert_eq!(
        nomad(&agent, "GET", "/v1/plugin/csi/nope", "").0,
        404,
        "an unknown plugin"
    );

    // Create through the controller, then register a second entry for its volume.
    let create = r#"{"Volumes": [{"ID": "made", "Name": "made", "PluginID": "hostpath",
        "RequestedCapacityMin": 1048576,
        "RequestedCapabilities": [{"AccessMode": "single-node-writer", "AttachmentMode": "file-system"}]}]}"#;
    let (status, created) = nomad(&agent, "PUT", "/v1/volume/csi/made/create", create);
    assert_eq!(status, 200, "{created}\n{}", agent.output());
    let made = &created["Volumes"][0];
    assert_eq!(made["ID"], "made");
    assert!(made["Capacity"].as_i64().unwrap() >= 1 << 20, "{made}");
    assert!(agent.path().join("csi-data/made").is_dir());
    let external_id = made["ExternalID"].as_str().unwrap().to_string();
    // The RPCs are in the agent's metrics, with their plugin, method and code.
    let (_, metrics) = nomad(&agent, "GET", "/v1/metrics", "");
    let rpcs: Vec<(&str, &str)> = metrics["Samples"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|s| s["Name"] == "berth.csi.rpc" && s["Labels"]["plugin"] == "hostpath")
        .map(|s| {
            (
                s["Labels"]["method"].as_str().unwrap(),
                s["Labels"]["code"].as_str().unwrap(),
            )
        })
        .collect();
    assert!(rpcs.contains(&("CreateVolume", "OK")), "{rpcs:?}");
    assert!(rpcs.contains(&("Probe", "OK")), "{rpcs:?}");
    let register = serde_json::json!({"Volumes": [{
        "ID": "reg", "PluginID": "hostpath", "ExternalID": external_id,
        "RequestedCapabilities": [{"AccessMode": "single-node-reader-only", "AttachmentMode": "file-system"}],
        "Secrets": {"password": "xyzzy"},
    }]})
    .to_string();
    let (status, registered) = nomad(&agent, "PUT", "/v1/volume/csi/reg", &register);
    assert_eq!(status, 200, "{registered}");
    assert_eq!(registered["Volumes"][0]["Secrets"], serde_json::json!({}));

    // Bad input: Nomad's plain-text 400, and nothing registered.
    for (body, expected) in [
        (
            r#"{"Volumes": [{"ID": "bad", "PluginID": 7}]}"#.to_string(),
            "Volumes[0].PluginID must be a string",
        ),
        (
            register
                .replace("\"reg\"", "\"bad\"")
                .replace("hostpath", "nope"),
            "no CSI plugin \"nope\" is registered",
        ),
        (
            register
                .replace("\"reg\"", "\"bad\"")
                .replace("single-node-reader-only", "everyone"),
            "unknown access mode \"everyone\"",
        ),
        ("not json".to_string(), "Failed to decode request"),
    ] {
        let (status, answer) = nomad(&agent, "PUT", "/v1/volume/csi/bad", &body);
        assert_eq!(status, 400, "{body}: {answer}");
        assert!(
            answer.as_str().is_some_and(|text| text.contains(expected)),
            "{body}: {answer}"
        );
        assert_eq!(nomad(&agent, "GET", "/v1/volume/csi/bad", "").0, 404);
    }

    let (status, stubs) = nomad(&agent, "GET", "/v1/volumes?type=csi", "");
    assert_eq!(status, 200);
    let ids: Vec<&str> = stubs
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["ID"].as_str().unwrap())
        .collect();
    assert_eq!(ids, ["made", "reg"], "{stubs}");
    assert_eq!(stubs[0]["Provider"], "hostpath.csi.berth.dev");
    assert_eq!(stubs[0]["Schedulable"], true);
    assert_eq!(
        nomad(&agent, "GET", "/v1/volumes?type=csi&plugin_id=nope", "").1,
        serde_json::json!([])
    );
    assert_eq!(
        nomad(&agent, "GET", "/v1/volumes", "").1,
        serde_json::json!([])
    );
    assert_eq!(nomad(&agent, "GET", "/v1/volumes?type=ebs", "").0, 400);

    // A writer claims "made": it shows, and the volume cannot be deregistered.
    let writer = agent
        .run_job(
            "writer",
            &consumer_job(
                "writer",
                "service",
                "made",
                false,
                "echo hi > /vol/file; while true; do sleep 0.1; done",
            ),
        )
        .await;
    agent.wait_alloc(&writer, "running", is_running).await;
    let (_, volume) = nomad(&agent, "GET", "/v1/volume/csi/made", "");
    assert_eq!(
        volume["WriteAllocs"],
        serde_json::json!({ writer.clone(): null })
    );
    assert_eq!(volume["ReadAllocs"], serde_json::json!({}));
    assert_eq!(volume["Allocations"][0]["ID"], writer.as_str());
    assert_eq!(volume["AccessMode"], "single-node-writer");
    assert_eq!(volume["CurrentWriters"], 1);
    for path in ["/v1/volume/csi/made", "/v1/volume/csi/made?force=true"] {
        let (status, answer) = nomad(&agent, "DELETE", path, "");
        assert_eq!(status, 400, "{path}: {answer}");
        assert!(
            answer.as_str().unwrap().contains("writer.g[0]"),
            "{path}: {answer}"
        );
    }
    assert_eq!(nomad(&agent, "GET", "/v1/volume/csi/made", "").0, 200);

    // Once the writer is stopped and has given the volume back, it goes.
    assert_eq!(nomad(&agent, "DELETE", "/v1/job/writer", "").0, 200);
    agent.finished(&writer).await;
    let deadline = Instant::now() + Duration::from_secs(30);
    while !agent.volume("made").await.claims.is_empty() {
        assert!(Instant::now() < deadline, "the claim was never released");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    for id in ["made", "reg"] {
        let (status, answer) = nomad(&agent, "DELETE", &format!("/v1/volume/csi/{id}"), "");
        assert_eq!(status, 200, "{id}: {answer}");
        assert_eq!(
            nomad(&agent, "GET", &format!("/v1/volume/csi/{id}"), "").1,
            "volume not found"
        );
    }
}
