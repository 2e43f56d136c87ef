//! Two agents in one process (as tests and benches run them) are two nodes: each keeps
//! its own name, datacenter and attributes, in its constraints and its API's answers.

use berth_client::config::AgentConfig;
use berth_harness::InProcessAgent;

async fn agent_named(name: &str, datacenter: &str) -> InProcessAgent {
    let config = AgentConfig {
        name: Some(name.into()),
        datacenter: Some(datacenter.into()),
        plugins: vec![berth_client::config::PluginConfig {
            name: "mock".into(),
            enabled: Some(true),
            ..Default::default()
        }],
        ..AgentConfig::default()
    };
    InProcessAgent::start("berth-e2e-two-agents", config)
        .await
        .unwrap()
}

/// A job only the node named `node` may run (a batch job, done at once: nothing of it is
/// still starting when the test's agents are dropped).
fn job_for(node: &str) -> String {
    format!(
        r#"job "only-{node}" {{
  type = "batch"
  constraint {{
    attribute = "${{node.unique.name}}"
    value     = "{node}"
  }}
  group "g" {{
    task "t" {{
      driver = "mock"
      config {{
        run_for = "0s"
      }}
    }}
  }}
}}
"#
    )
}

#[tokio::test(flavor = "multi_thread")]
async fn two_agents_in_one_process_keep_their_own_names() {
    let left = agent_named("left", "east").await;
    let right = agent_named("right", "west").await;
    for (agent, name, datacenter) in [(&left, "left", "east"), (&right, "right", "west")] {
        let facts = agent.agent().facts();
        assert_eq!(facts["node.unique.name"], name);
        assert_eq!(facts["node.datacenter"], datacenter);
    }
    // Each node runs the job meant for it; the other's waits, unplaced, its
    // evaluation saying that this node's name did not meet its constraint.
    for (here, there) in [(&left, "right"), (&right, "left")] {
        let own = here.agent().facts()["node.unique.name"].clone();
        let submitted = here
            .agent()
            .submit("own.hcl", &job_for(&own))
            .await
            .unwrap_or_else(|e| panic!("{own} refused its own job: {e}"));
        assert_eq!(submitted.alloc_ids.len(), 1, "{submitted:?}");
        tokio::time::timeout(
            std::time::Duration::from_secs(60),
            here.agent().wait_job(&submitted.job_id),
        )
        .await
        .expect("the job finished");
        let waiting = here
            .agent()
            .submit("other.hcl", &job_for(there))
            .await
            .unwrap();
        assert!(
            waiting.alloc_ids.is_empty(),
            "a node ran a job constrained to the other: {waiting:?}"
        );
        let evaluation = here
            .agent()
            .cluster()
            .evaluation(&waiting.eval_id)
            .unwrap()
            .unwrap();
        let why = &evaluation.failed[0].why;
        assert!(why.contains("node.unique.name"), "{why}");
    }
}

/// One agent's API at its limits (every stream place taken) leaves the other's alone.
#[tokio::test(flavor = "multi_thread")]
async fn two_agents_in_one_process_hold_their_own_api_places() {
    let left = agent_named("left", "east").await;
    let right = agent_named("right", "west").await;
    let streams = &left.agent().api_places().streams;
    let held: Vec<_> = std::iter::from_fn(|| streams.enter())
        .take(streams.max() + 1)
        .collect();
    assert_eq!(held.len(), streams.max());
    assert!(right.agent().api_places().streams.enter().is_some());
    assert!(right.agent().api_places().reads.enter().is_some());
    assert!(right.agent().api_places().waiting.enter().is_some());
}
