//! A real agent on a real etcd secured as an operator would: TLS with a client
//! certificate, and etcd's auth with a `berth` user granted only the agent's prefix.
//! The agent joins, places and runs a job, and warns of no missing credentials.

use std::time::{Duration, Instant};

use berth_harness::AgentProcess;
use berth_testkit::etcd::{EtcdServer, Security};
use serde_json::Value;

const ONE_SLEEPER: &str = r#"
job "sleeper" {
  group "g" {
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

#[tokio::test(flavor = "multi_thread")]
async fn an_agent_joins_a_tls_and_auth_etcd_and_runs_a_placed_job() {
    let etcd = EtcdServer::start_secured(Security {
        tls: true,
        client_cert_auth: true,
        auth: true,
        prefix: "/e2e-secure",
        auth_token_ttl: None,
    });
    let endpoint = etcd.endpoint();
    assert!(endpoint.starts_with("https://"), "{endpoint}");
    let secured = etcd.config_lines();
    let mut agent = AgentProcess::production(move |_, _| {
        format!(
            "name = \"node-a\"\n\
             cluster {{\n  store = \"etcd\"\n  endpoints = [\"{endpoint}\"]\n  \
             prefix = \"/e2e-secure\"\n  heartbeat_ttl = \"2s\"\n{secured}}}\n"
        )
    });
    agent.start().await;
    let nodes: Value = agent.client().get("/v1/nodes").await.unwrap();
    assert_eq!(nodes.as_array().map(Vec::len), Some(1), "{nodes}");

    agent.submit("sleeper.hcl", ONE_SLEEPER).await.unwrap();
    let started = Instant::now();
    loop {
        let listed: Value = agent
            .client()
            .get("/v1/job/sleeper/allocations")
            .await
            .unwrap();
        let running = listed.as_array().is_some_and(|allocs| {
            allocs
                .iter()
                .any(|a| a["ClientStatus"] == "running" && a["NodeName"] == "node-a")
        });
        if running {
            break;
        }
        assert!(
            started.elapsed() < Duration::from_secs(30),
            "the job was not placed and running within 30 s: {listed:#}\n{}",
            agent.output()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(
        !agent.output().contains("no credentials"),
        "the agent warned of missing credentials it has:\n{}",
        agent.output()
    );
}
