//! Nomad's alloc actions and stats on a production agent over TCP, as `curl` would
//! send them with `X-Nomad-Token`: a restart that the restart policy does not count, a
//! signal the task's own trap sees, the scopes both need, the alloc's stats read from
//! its cgroup, the node's from `/proc`, and `berth alloc restart|signal`.

use std::time::{Duration, Instant};

use berth_harness::AgentProcess;
use serde_json::Value;

use crate::nomad_api::http;

const VIEWER: &str = "viewer-secret-0123456789";

/// An exec task that appends a line to `alloc/data/hup` on each SIGHUP, and burns a
/// little CPU so its stats have something to show. `attempts = 0` in fail mode: any
/// restart the policy counted would fail the alloc.
const JOB: &str = r#"job "actions" {
  group "g" {
    restart {
      attempts = 0
      mode     = "fail"
    }
    task "t" {
      driver = "exec"
      kill_timeout = "2s"
      config {
        command = "/bin/sh"
        args    = ["-c", "trap 'echo hup >> $NOMAD_ALLOC_DIR/data/hup' HUP; while :; do i=0; while [ $i -lt 2000 ]; do i=$((i+1)); done; sleep 0.05; done"]
      }
      resources {
        memory = 64
      }
    }
  }
}
"#;

fn json(body: &str) -> Value {
    serde_json::from_str(body).unwrap_or_else(|e| panic!("not JSON ({e}): {body}"))
}

fn started_count(status: &berth_client::alloc_runner::AllocStatus) -> usize {
    status.tasks["t"]
        .events
        .iter()
        .filter(|e| e.kind == berth_model::events::EventKind::Started)
        .count()
}

#[tokio::test(flavor = "multi_thread")]
async fn alloc_restart_signal_and_stats_work_as_nomads() {
    let mut agent = AgentProcess::production(|port, dir| {
        format!(
            "http {{\n  address = \"127.0.0.1:{port}\"\n  token_file = \"{}/api-token\"\n  token \"viewer\" {{\n    secret = \"{VIEWER}\"\n    scope  = \"read\"\n  }}\n}}\n",
            dir.display()
        )
    });
    agent.start().await;
    let token = std::fs::read_to_string(agent.path().join("api-token"))
        .unwrap()
        .trim()
        .to_string();
    let port = agent.port();
    // Submitted with the token, which so owns the job: restarting and signaling an
    // alloc need its job's owner (or the operator).
    let request = berth_api::SubmitRequest {
        source_name: "actions.hcl".into(),
        source: JOB.into(),
        variables: Default::default(),
    };
    let submitted: berth_client::agent::Submitted =
        berth_api::client::Client::new(&agent.address())
            .unwrap()
            .with_token(Some(token.clone()))
            .post("/v1/berth/jobs", &request)
            .await
            .unwrap();
    let id = submitted.alloc_ids[0].clone();
    agent
        .wait_alloc(&id, "its task running", |s| started_count(s) == 1)
        .await;
    let alloc_dir = agent.alloc(&id).await.alloc_dir;

    // Stats: read scope is enough; the task's own cgroup is read.
    let (status, _, body) = http(
        port,
        "GET",
        &format!("/v1/client/allocation/{id}/stats"),
        VIEWER,
        "",
    );
    assert_eq!(status, 200, "{body}");
    let stats = json(&body);
    let task = &stats["Tasks"]["t"]["ResourceUsage"];
    let measured = |part: &str| -> Vec<String> {
        serde_json::from_value(task[part]["Measured"].clone()).unwrap()
    };
    assert!(
        measured("MemoryStats").contains(&"RSS".to_string()),
        "{stats:#}"
    );
    assert!(
        measured("CpuStats").contains(&"Percent".to_string()),
        "{stats:#}"
    );
    assert!(
        task["MemoryStats"]["RSS"].as_u64().unwrap() > 0,
        "{stats:#}"
    );
    assert!(
        task["MemoryStats"]["Usage"].as_u64().unwrap() > 0,
        "{stats:#}"
    );
    assert!(
        task["CpuStats"]["Percent"].as_f64().unwrap() > 0.0,
        "{stats:#}"
    );
    assert_eq!(
        stats["ResourceUsage"]["MemoryStats"]["RSS"],
        task["MemoryStats"]["RSS"]
    );
    assert!(stats["Timestamp"].as_u64().unwrap() > 0);

    // The node's stats.
    let (status, _, body) = http(port, "GET", "/v1/client/stats", VIEWER, "");
    assert_eq!(status, 200, "{body}");
    let host = json(&body);
    assert!(host["Memory"]["Total"].as_u64().unwrap() > 0, "{host:#}");
    assert!(host["Uptime"].as_u64().unwrap() > 0, "{host:#}");
    assert!(!host["CPU"].as_array().unwrap().is_empty(), "{host:#}");
    assert!(
        host["DiskStats"][0]["Size"].as_u64().unwrap() > 0,
        "{host:#}"
    );
    assert!(
        host["AllocDirStats"]["Size"].as_u64().unwrap() > 0,
        "{host:#}"
    );

    // Signal: a read token may not; an unknown name is refused by name; SIGHUP reaches
    // the task's trap.
    let signal = format!("/v1/client/allocation/{id}/signal");
    let (status, _, body) = http(port, "POST", &signal, VIEWER, r#"{"Signal": "SIGHUP"}"#);
    assert_eq!(status, 403, "{body}");
    let (status, _, body) = http(
        port,
        "POST",
        &signal,
        &token,
        r#"{"Signal": "SIGBOGUS", "Task": "t"}"#,
    );
    assert_eq!(status, 400, "{body}");
    assert!(body.contains("SIGBOGUS"), "{body}");
    let (status, _, body) = http(
        port,
        "POST",
        &signal,
        &token,
        r#"{"Signal": "SIGHUP", "Task": "t"}"#,
    );
    assert_eq!((status, body.as_str()), (200, "{}"));
    let hup = alloc_dir.join("alloc/data/hup");
    let deadline = Instant::now() + Duration::from_secs(10);
    while !hup.exists() {
        assert!(
            Instant::now() < deadline,
            "the task's trap never saw SIGHUP"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }

    // Restart: a read token may not; an unknown task is a 404; the restart is not
    // counted by the policy (attempts = 0 would fail the alloc).
    let restart = format!("/v1/client/allocation/{id}/restart");
    let (status, _, _) = http(port, "POST", &restart, VIEWER, "{}");
    assert_eq!(status, 403);
    let (status, _, body) = http(port, "POST", &restart, &token, r#"{"TaskName": "nope"}"#);
    assert_eq!(status, 404, "{body}");
    let (status, _, body) = http(
        port,
        "POST",
        &restart,
        &token,
        r#"{"TaskName": "t", "AllTasks": true}"#,
    );
    assert_eq!(status, 400, "{body}");
    let (status, _, body) = http(port, "POST", &restart, &token, r#"{"TaskName": "t"}"#);
    assert_eq!((status, body.as_str()), (200, "{}"));
    agent
        .wait_alloc(&id, "its task started again", |s| started_count(s) == 2)
        .await;
    // The CLI, the same way, without a task: every running task.
    let (code, out, err) = agent.cli(&["alloc", "restart", &id[..8]]);
    assert_eq!(code, 0, "{out}{err}");
    agent
        .wait_alloc(&id, "its task started a third time", |s| {
            started_count(s) == 3
        })
        .await;
    let (code, out, err) = agent.cli(&["alloc", "signal", "-s", "SIGHUP", &id, "t"]);
    assert_eq!(code, 0, "{out}{err}");

    let (status, _, body) = http(port, "GET", &format!("/v1/allocation/{id}"), &token, "");
    assert_eq!(status, 200);
    let alloc = json(&body);
    assert_eq!(alloc["ClientStatus"], "running", "{alloc:#}");
    let state = &alloc["TaskStates"]["t"];
    assert_eq!(
        (state["State"].as_str(), state["Failed"].as_bool()),
        (Some("running"), Some(false))
    );
    let signaled: Vec<&Value> = state["Events"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["Type"] == "Restart Signaled")
        .collect();
    assert_eq!(signaled.len(), 2, "{state:#}");
    assert_eq!(
        signaled[0]["DisplayMessage"],
        "User requested task to restart"
    );

    // Stopped, the task is not running: a 400 that says so.
    let (status, _, _) = http(
        port,
        "POST",
        &format!("/v1/allocation/{id}/stop"),
        &token,
        "",
    );
    assert_eq!(status, 200);
    agent.finished(&id).await;
    let (status, _, body) = http(
        port,
        "POST",
        &signal,
        &token,
        r#"{"Signal": "SIGHUP", "Task": "t"}"#,
    );
    assert_eq!(status, 400, "{body}");
    assert!(body.contains("not running"), "{body}");
    let (status, _, body) = http(port, "POST", &restart, &token, "");
    assert_eq!(status, 400, "{body}");
}

/// `berth alloc fs` shows an alloc's files as Nomad's does (the alloc's root holds
/// `alloc/` and a directory per task), prints a file, stats one, and follows no link a
/// task planted; `berth alloc stop` ends the alloc and its replacement runs.
#[tokio::test(flavor = "multi_thread")]
async fn alloc_fs_lists_prints_and_stats_without_following_links_and_alloc_stop_replaces() {
    let mut agent = AgentProcess::new();
    agent.start().await;
    let alloc = agent
        .run_job(
            "files.hcl",
            r#"job "files" {
  group "g" {
    task "t" {
      driver = "exec"
      config {
        command = "/bin/sh"
        args    = ["-c", "echo hello > local/hello.txt; ln -s /etc/shadow local/shadow; ln -s / local/root; echo ready; sleep 300"]
      }
    }
  }
}
"#,
        )
        .await;
    let deadline = Instant::now() + Duration::from_secs(20);
    while !agent.task_stdout(&alloc, "t").contains("ready") {
        assert!(Instant::now() < deadline, "{}", agent.output());
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let fs = |args: &[&str]| {
        let mut all = vec!["alloc", "fs"];
        all.extend_from_slice(args);
        agent.cli(&all)
    };
    let (code, out, err) = fs(&[&alloc[..8]]);
    assert_eq!(code, 0, "{out}{err}");
    let names: Vec<&str> = out
        .lines()
        .skip(1)
        .filter_map(|l| l.split_whitespace().last())
        .collect();
    assert_eq!(names, ["alloc/", "t/"], "{out}");
    let (code, out, err) = fs(&[&alloc, "t/local"]);
    assert_eq!(code, 0, "{out}{err}");
    for name in ["hello.txt", "shadow", "root"] {
        assert!(
            out.lines().any(|l| l.ends_with(&format!(" {name}"))),
            "{name} in {out}"
        );
    }
    let (code, out, err) = fs(&[&alloc, "t/local/hello.txt"]);
    assert_eq!((code, out.as_str()), (0, "hello\n"), "{err}");
    let (code, out, err) = fs(&["--stat", &alloc, "t/local/hello.txt"]);
    assert_eq!(code, 0, "{out}{err}");
    let row: Vec<&str> = out
        .lines()
        .nth(1)
        .unwrap_or_default()
        .split_whitespace()
        .collect();
    assert_eq!(
        (
            row.first().copied(),
            row.get(1).copied(),
            row.last().copied()
        ),
        (Some("-rw-r--r--"), Some("6"), Some("hello.txt")),
        "{out}"
    );
    // The task's links are shown, never followed: neither the host's shadow file nor
    // its root.
    for link in ["t/local/shadow", "t/local/root", "t/local/root/etc"] {
        let (code, out, err) = fs(&[&alloc, link]);
        assert_ne!(code, 0, "{link}: {out}");
        assert!(
            !out.contains("root:") && !out.contains("bin/"),
            "{link}: {out}"
        );
        assert!(!err.is_empty(), "{link}: no error said");
    }
    // A path out of the alloc dir is refused.
    let (code, out, err) = fs(&[&alloc, "../../.."]);
    assert_ne!(code, 0, "{out}{err}");

    // Stop: the alloc ends; the service job's replacement runs.
    let (code, out, err) = agent.cli(&["alloc", "stop", &alloc[..8]]);
    assert_eq!(code, 0, "{out}{err}");
    assert!(
        out.contains(&format!("==> Alloc {alloc} stopped (complete)")),
        "{out}"
    );
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let allocs = crate::cluster::allocs(&agent, "files").await;
        let stopped = allocs.iter().find(|a| a.0 == alloc).map(|a| a.3.as_str());
        let replaced = allocs.iter().any(|a| a.0 != alloc && a.3 == "running");
        if stopped == Some("complete") && replaced {
            break;
        }
        assert!(Instant::now() < deadline, "no replacement: {allocs:?}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// `alloc stop` on a cluster, asked of the agent that does not run the alloc: the same
/// path as on a lone agent (the placement marked, the scheduler stopping it and placing
/// the group's alloc again), from any member.
#[tokio::test(flavor = "multi_thread")]
async fn alloc_stop_asked_of_another_member_stops_the_alloc_and_places_it_again() {
    let etcd = berth_testkit::etcd::EtcdServer::start();
    let mut nodes = [
        crate::cluster::member(&etcd, "stop-a"),
        crate::cluster::member(&etcd, "stop-b"),
    ];
    for node in &mut nodes {
        node.start().await;
    }
    let source = r#"job "moved" {
  group "g" {
    task "t" {
      driver = "exec"
      config {
        command = "/bin/sleep"
        args    = ["300"]
      }
    }
  }
}
"#;
    nodes[0].submit("moved.hcl", source).await.unwrap();
    crate::cluster::wait_allocs(
        &nodes[0],
        "moved",
        "a running alloc",
        Duration::from_secs(60),
        |allocs| allocs.iter().any(|a| a.3 == "running"),
    )
    .await;
    let allocs = crate::cluster::allocs(&nodes[0], "moved").await;
    let (alloc, _, node, _) = allocs.iter().find(|a| a.3 == "running").unwrap().clone();
    // Asked of the member that does not run it.
    let other = match node.as_str() {
        "stop-a" => &nodes[1],
        "stop-b" => &nodes[0],
        other => panic!("an alloc on {other}"),
    };
    let (code, out, err) = other.cli(&["alloc", "stop", &alloc]);
    assert_eq!(code, 0, "{out}{err}");
    assert!(out.contains("evaluation"), "{out}");
    crate::cluster::wait_allocs(
        other,
        "moved",
        "the alloc stopped and another running",
        Duration::from_secs(60),
        |allocs| {
            allocs.iter().any(|a| a.0 == alloc && a.3 == "complete")
                && allocs.iter().any(|a| a.0 != alloc && a.3 == "running")
        },
    )
    .await;
    let (code, out, err) = nodes[0].cli(&["job", "stop", "moved"]);
    assert_eq!(code, 0, "{out}{err}");
}
