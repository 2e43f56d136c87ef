//! Jobs that launch jobs, in a cluster of two agents on a real etcd: a parameterized job
//! submitted to one agent is dispatched on the other, its child placed by the scheduler
//! with the dispatch's meta and payload; a periodic job's children are launched by the
//! scheduler on the schedule (one per launch time, whichever agent leads), forced from
//! either agent, and no longer launched once the job is stopped.

use std::time::{Duration, Instant};

use berth_harness::AgentProcess;
use berth_testkit::etcd::EtcdServer;
use serde_json::Value;

use crate::cluster;

const RENDER: &str = r#"
job "render" {
  type = "batch"

  parameterized {
    payload       = "required"
    meta_required = ["format"]
  }

  group "render" {
    restart {
      attempts = 0
    }
    task "render" {
      driver = "exec"
      dispatch_payload {
        file = "input/doc.md"
      }
      config {
        command = "sh"
        args    = ["-c", "test \"$NOMAD_META_format\" = pdf && test \"$(cat ${NOMAD_TASK_DIR}/input/doc.md)\" = '# hello payload' && test \"$NOMAD_JOB_PARENT_ID\" = render"]
      }
    }
  }
}
"#;

const TICK: &str = r#"
job "tick" {
  type = "batch"

  periodic {
    crons = ["* * * * * * *"]
  }

  group "g" {
    restart {
      attempts = 0
    }
    task "t" {
      driver = "exec"
      config {
        command = "true"
      }
    }
  }
}
"#;

/// The cluster's jobs whose id starts with `prefix`.
async fn jobs(agent: &AgentProcess, prefix: &str) -> Vec<Value> {
    let listed: Value = agent
        .client()
        .get(&format!("/v1/jobs?prefix={}", prefix.replace('/', "%2F")))
        .await
        .unwrap();
    listed.as_array().cloned().unwrap_or_default()
}

/// Waits until the job's one alloc has ended, and returns its client status.
async fn ended(agent: &AgentProcess, job: &str) -> String {
    let deadline = Instant::now() + Duration::from_secs(40);
    loop {
        let allocs = cluster::allocs(agent, &job.replace('/', "%2F")).await;
        if let Some((_, _, _, status)) = allocs
            .iter()
            .find(|(.., status)| status == "complete" || status == "failed")
        {
            return status.clone();
        }
        assert!(
            Instant::now() < deadline,
            "{job} never ended: {allocs:?}\n{}",
            agent.output()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn a_parameterized_job_submitted_on_one_node_is_dispatched_on_another() {
    let etcd = EtcdServer::start();
    let mut a = cluster::member(&etcd, "node-a");
    let mut b = cluster::member(&etcd, "node-b");
    a.start().await;
    b.start().await;
    a.submit("render.hcl", RENDER).await.unwrap();
    let (code, shown, err) = b.cli(&["job", "status", "render"]);
    assert_eq!(code, 0, "{err}");
    assert!(shown.contains("Status    = running"), "{shown}");
    // A parameterized job places nothing itself.
    assert!(cluster::allocs(&a, "render").await.is_empty());

    let payload = b.path().join("doc.md");
    std::fs::write(&payload, "# hello payload").unwrap();
    let payload = payload.to_str().unwrap();
    let (code, stdout, stderr) =
        b.cli(&["job", "dispatch", "-meta", "format=pdf", "render", payload]);
    assert_eq!(code, 0, "{stdout}{stderr}");
    let child = stdout
        .lines()
        .find_map(|l| l.strip_prefix("Dispatched Job ID = "))
        .unwrap_or_else(|| panic!("{stdout}"))
        .to_string();
    assert!(child.starts_with("render/dispatch-"), "{child}");
    // The task checks its meta, payload and parent: complete means all were there.
    assert_eq!(ended(&a, &child).await, "complete");
    let listed = jobs(&a, "render/").await;
    assert_eq!(listed.len(), 1, "{listed:?}");
    assert_eq!(listed[0]["ParentID"], "render", "{listed:?}");

    // Refusals say what the block wants, from either node.
    let (code, _, stderr) = a.cli(&["job", "dispatch", "render", payload]);
    assert_eq!(code, 2);
    assert!(
        stderr.contains("job \"render\" requires meta format"),
        "{stderr}"
    );
    let (code, _, stderr) = a.cli(&["job", "dispatch", "-meta", "format=pdf", "nope", payload]);
    assert_eq!(code, 2);
    assert!(stderr.contains("no job matches \"nope\""), "{stderr}");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_periodic_job_is_launched_by_the_cluster_on_its_schedule_and_by_force() {
    let etcd = EtcdServer::start();
    let mut a = cluster::member(&etcd, "node-a");
    let mut b = cluster::member(&etcd, "node-b");
    a.start().await;
    b.start().await;
    a.submit("tick.hcl", TICK).await.unwrap();

    // Every second, one child per launch time (two agents, one scheduler).
    let deadline = Instant::now() + Duration::from_secs(30);
    let launched = loop {
        let launched = jobs(&b, "tick/periodic-").await;
        if launched.len() >= 3 {
            break launched;
        }
        assert!(
            Instant::now() < deadline,
            "fewer than 3 launches: {launched:?}\n{}",
            a.output()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    let ids: Vec<&str> = launched.iter().filter_map(|j| j["ID"].as_str()).collect();
    let mut distinct = ids.clone();
    distinct.dedup();
    assert_eq!(ids, distinct, "one child per launch time");
    assert_eq!(ended(&a, ids[0]).await, "complete");

    // Forced from the other node: a child now.
    let (code, stdout, stderr) = b.cli(&["job", "periodic", "force", "tick"]);
    assert_eq!(code, 0, "{stdout}{stderr}");
    assert!(
        stdout.contains("Launched Job ID = tick/periodic-"),
        "{stdout}"
    );

    // Stopped: no more launches (the children launched stay listed).
    let (code, _, stderr) = a.cli(&["job", "stop", "tick"]);
    assert_eq!(code, 0, "{stderr}");
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let before = jobs(&a, "tick/periodic-").await.len();
    tokio::time::sleep(Duration::from_secs(3)).await;
    let after = jobs(&a, "tick/periodic-").await.len();
    assert_eq!(before, after, "launched after the stop");
}
