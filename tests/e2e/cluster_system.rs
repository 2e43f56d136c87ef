//! `system` and `sysbatch` jobs on a cluster of three agents and a real etcd: a system
//! job runs one alloc on every node, a sysbatch job runs once to completion on each;
//! as in Nomad, a node made ineligible keeps its system alloc (it only takes no new
//! ones), and a drained node stops it.

use std::collections::BTreeMap;
use std::time::Duration;

use serde_json::Value;

use crate::cluster::{allocs, member, running_per_node, wait_allocs};
use berth_testkit::etcd::EtcdServer;

const SYSTEM_JOB: &str = r#"
job "node-agent" {
  type = "system"
  group "agent" {
    task "sleep" {
      driver = "exec"
      config {
        command = "/bin/sleep"
        args    = ["600"]
      }
      resources {
        cpu    = 50
        memory = 16
      }
    }
  }
}
"#;

const SYSBATCH_JOB: &str = r#"
job "sweep" {
  type = "sysbatch"
  group "once" {
    task "true" {
      driver = "exec"
      config {
        command = "/bin/true"
      }
      resources {
        cpu    = 50
        memory = 16
      }
    }
  }
}
"#;

/// Allocs per node name with `status`.
fn per_node_with(allocs: &[(String, String, String, String)], status: &str) -> Vec<String> {
    let mut nodes: Vec<String> = allocs
        .iter()
        .filter(|(_, _, _, s)| s == status)
        .map(|(_, _, node, _)| node.clone())
        .collect();
    nodes.sort();
    nodes
}

fn one_each(nodes: &[&str]) -> BTreeMap<String, usize> {
    nodes.iter().map(|n| (n.to_string(), 1)).collect()
}

#[tokio::test(flavor = "multi_thread")]
async fn a_system_job_runs_on_every_node_and_a_sysbatch_job_once_on_each() {
    let etcd = EtcdServer::start();
    let mut a = member(&etcd, "node-a");
    let mut b = member(&etcd, "node-b");
    let mut c = member(&etcd, "node-c");
    a.start().await;
    b.start().await;
    c.start().await;

    // One alloc per node, whichever agent the job was submitted to.
    a.submit("node-agent.hcl", SYSTEM_JOB).await.unwrap();
    wait_allocs(
        &b,
        "node-agent",
        "one running alloc on each of the three nodes",
        Duration::from_secs(30),
        |all| running_per_node(all) == one_each(&["node-a", "node-b", "node-c"]),
    )
    .await;
    let job: Value = c.client().get("/v1/job/node-agent").await.unwrap();
    assert_eq!(job["Type"], "system", "{job:#}");
    let evaluations: Value = c
        .client()
        .get("/v1/job/node-agent/evaluations")
        .await
        .unwrap();
    assert_eq!(evaluations[0]["Type"], "system", "{evaluations:#}");
    let (code, out, err) = c.cli(&["job", "status", "node-agent"]);
    assert_eq!(code, 0, "{out}{err}");
    assert!(
        out.lines()
            .any(|l| l.starts_with("Type") && l.ends_with("system")),
        "{out}"
    );

    // A sysbatch job completes once on each node, and is not run again there.
    b.submit("sweep.hcl", SYSBATCH_JOB).await.unwrap();
    wait_allocs(
        &a,
        "sweep",
        "one complete alloc on each of the three nodes",
        Duration::from_secs(30),
        |all| per_node_with(all, "complete") == ["node-a", "node-b", "node-c"],
    )
    .await;

    // node-c is made ineligible: as in Nomad, its system alloc stays. A system job
    // submitted after that lands on a and b only, which also shows the scheduler has
    // seen the change.
    let (code, out, err) = a.cli(&["node", "eligibility", "--disable", "node-c"]);
    assert_eq!(code, 0, "{out}{err}");
    let late = SYSTEM_JOB.replace("node-agent", "late-agent");
    a.submit("late-agent.hcl", &late).await.unwrap();
    wait_allocs(
        &a,
        "late-agent",
        "the later system job on the eligible nodes only",
        Duration::from_secs(30),
        |all| running_per_node(all) == one_each(&["node-a", "node-b"]),
    )
    .await;
    assert_eq!(
        running_per_node(&allocs(&a, "node-agent").await),
        one_each(&["node-a", "node-b", "node-c"]),
        "an ineligible node keeps its system alloc"
    );

    // node-b is drained: its system allocs stop (nothing else runs there), none is
    // placed elsewhere, and the others keep theirs.
    let (code, out, err) = a.cli(&["node", "drain", "--enable", "node-b"]);
    assert_eq!(code, 0, "{out}{err}");
    wait_allocs(
        &c,
        "node-agent",
        "node-b's system alloc stopped, a's and c's running",
        Duration::from_secs(30),
        |all| running_per_node(all) == one_each(&["node-a", "node-c"]),
    )
    .await;
    wait_allocs(
        &c,
        "late-agent",
        "node-b's later system alloc stopped",
        Duration::from_secs(30),
        |all| running_per_node(all) == one_each(&["node-a"]),
    )
    .await;
    // The sysbatch job ran once per node, all along.
    let sweep = allocs(&c, "sweep").await;
    assert_eq!(sweep.len(), 3, "{sweep:#?}");
    assert_eq!(
        per_node_with(&sweep, "complete"),
        ["node-a", "node-b", "node-c"]
    );
}
