//! A cluster of three agents on a real etcd places a failed alloc again as its job's
//! `reschedule` block says: after the delay, on a node it has not failed on, with the
//! attempts it carries shown in the Nomad API, and no more once its attempts are used.

use std::time::Duration;

use berth_testkit::etcd::EtcdServer;
use serde_json::Value;

use crate::cluster::{allocs, member, wait_allocs};

/// A batch task that always fails, not restarted where it fails, placed again twice,
/// 5 s (Nomad's shortest delay) after each failure.
const FAILING_JOB: &str = r#"
job "flaky" {
  type = "batch"
  reschedule {
    attempts       = 2
    interval       = "1h"
    delay          = "5s"
    delay_function = "constant"
  }
  group "g" {
    restart {
      attempts = 0
      mode     = "fail"
    }
    task "fail" {
      driver = "exec"
      config {
        command = "/bin/false"
      }
      resources {
        cpu    = 50
        memory = 16
      }
    }
  }
}
"#;

const DELAY_NS: u64 = 5_000_000_000;

#[tokio::test(flavor = "multi_thread")]
async fn a_failed_alloc_is_placed_again_on_other_nodes_until_its_attempts_are_used() {
    let etcd = EtcdServer::start();
    let mut a = member(&etcd, "node-a");
    let mut b = member(&etcd, "node-b");
    let mut c = member(&etcd, "node-c");
    a.start().await;
    b.start().await;
    c.start().await;

    // In a cluster the block has an effect: no warning says it has none.
    let submitted = a.submit("flaky.hcl", FAILING_JOB).await.unwrap();
    assert!(
        submitted.warnings.iter().all(|w| !w.contains("reschedule")),
        "{:?}",
        submitted.warnings
    );

    // The first alloc and its two replacements fail, each on a node of its own.
    let failed_all = |all: &[(String, String, String, String)]| {
        all.len() == 3 && all.iter().all(|(.., status)| status == "failed")
    };
    let took = wait_allocs(
        &b,
        "flaky",
        "three failed allocs",
        Duration::from_secs(60),
        failed_all,
    )
    .await;
    eprintln!("three attempts failed within {took:?}");
    let listed: Value = c.client().get("/v1/job/flaky/allocations").await.unwrap();
    let mut stubs: Vec<Value> = listed.as_array().unwrap().clone();
    stubs.sort_by_key(|s| s["CreateTime"].as_u64().unwrap());
    let nodes: std::collections::BTreeSet<&str> = stubs
        .iter()
        .map(|s| s["NodeName"].as_str().unwrap())
        .collect();
    assert_eq!(nodes.len(), 3, "each attempt on another node: {stubs:#?}");

    // The replacements: the chain of allocs, the attempts each carries, and the delay
    // kept after each failure.
    let ids: Vec<&str> = stubs.iter().map(|s| s["ID"].as_str().unwrap()).collect();
    let node_ids: Vec<&str> = stubs
        .iter()
        .map(|s| s["NodeID"].as_str().unwrap())
        .collect();
    // The last one is still placed (failed there); the two before were replaced.
    let last = &stubs[2];
    assert_eq!(last["PreviousAllocation"], ids[1], "{last:#}");
    let events = last["RescheduleTracker"]["Events"].as_array().unwrap();
    assert_eq!(events.len(), 2, "{last:#}");
    for (i, event) in events.iter().enumerate() {
        assert_eq!(event["PrevAllocID"], ids[i]);
        assert_eq!(event["PrevNodeID"], node_ids[i]);
        assert_eq!(event["Delay"], DELAY_NS);
    }
    assert_eq!(stubs[0]["NextAllocation"], ids[1]);
    assert_eq!(stubs[1]["NextAllocation"], ids[2]);
    for pair in stubs.windows(2) {
        let failed = pair[0]["ModifyTime"].as_u64().unwrap();
        let placed = pair[1]["CreateTime"].as_u64().unwrap();
        assert!(
            placed >= failed + DELAY_NS,
            "placed {} ms after the failure",
            (placed.saturating_sub(failed)) / 1_000_000
        );
    }

    // Its attempts used, the last alloc stays failed: nothing more is placed, the job
    // is dead and its evaluation says why.
    tokio::time::sleep(Duration::from_secs(8)).await;
    assert_eq!(allocs(&a, "flaky").await.len(), 3);
    let job: Value = a.client().get("/v1/job/flaky").await.unwrap();
    assert_eq!(job["Status"], "dead", "{job:#}");
    let evaluations: Value = b.client().get("/v1/job/flaky/evaluations").await.unwrap();
    let why = evaluations[0]["StatusDescription"].as_str().unwrap();
    assert!(
        why.contains("reschedule attempts used up") && why.contains("flaky.g[0]"),
        "{evaluations:#}"
    );
}
