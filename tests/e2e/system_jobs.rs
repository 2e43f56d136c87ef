//! `system` and `sysbatch` jobs on one agent without a cluster: the node is the only
//! one, so each group runs one alloc here. `berth job run` of a sysbatch job runs it to
//! completion; a system job keeps running like a service; both keep their type; a count
//! above 1 is refused, as Nomad refuses it on a system job.

use berth_harness::AgentProcess;
use berth_model::status::ClientStatus;

const SWEEP: &str = r#"
job "sweep" {
  type = "sysbatch"
  group "once" {
    task "true" {
      driver = "exec"
      config {
        command = "/bin/true"
      }
    }
  }
}
"#;

const NODE_AGENT: &str = r#"
job "node-agent" {
  type = "system"
  group "agent" {
    task "sleep" {
      driver = "exec"
      config {
        command = "/bin/sleep"
        args    = ["600"]
      }
    }
  }
}
"#;

fn alloc_of(stdout: &str) -> String {
    stdout
        .lines()
        .find_map(|l| l.trim().strip_prefix("alloc "))
        .unwrap_or_else(|| panic!("no alloc in {stdout}"))
        .to_string()
}

fn shown_type(agent: &AgentProcess, job: &str) -> String {
    let (code, out, err) = agent.cli(&["job", "status", job]);
    assert_eq!(code, 0, "{out}{err}");
    out.lines()
        .find_map(|l| l.strip_prefix("Type"))
        .map(|rest| rest.trim_start_matches([' ', '=']).to_string())
        .unwrap_or_else(|| panic!("no Type in {out}"))
}

#[tokio::test(flavor = "multi_thread")]
async fn on_one_agent_sysbatch_runs_to_completion_and_system_keeps_running() {
    let mut agent = AgentProcess::new();
    agent.start().await;
    let write = |name: &str, source: &str| {
        let path = agent.path().join(name);
        std::fs::write(&path, source).unwrap();
        path.to_str().unwrap().to_string()
    };

    let sweep = write("sweep.hcl", SWEEP);
    let (code, out, err) = agent.cli(&["job", "run", &sweep]);
    assert_eq!(code, 0, "{out}{err}");
    let done = agent.finished(&alloc_of(&out)).await;
    assert_eq!(done.client_status, ClientStatus::Complete, "{done:#?}");
    assert_eq!(shown_type(&agent, "sweep"), "sysbatch");

    let node_agent = write("node-agent.hcl", NODE_AGENT);
    let (code, out, err) = agent.cli(&["job", "run", &node_agent]);
    assert_eq!(code, 0, "{out}{err}");
    agent
        .wait_alloc(&alloc_of(&out), "running", |s| {
            s.client_status == ClientStatus::Running
        })
        .await;
    assert_eq!(shown_type(&agent, "node-agent"), "system");
    let job: serde_json::Value = agent.client().get("/v1/job/node-agent").await.unwrap();
    assert_eq!(job["Type"], "system", "{job:#}");

    let two = write(
        "two.hcl",
        &NODE_AGENT
            .replace("node-agent", "two")
            .replace("group \"agent\" {", "group \"agent\" {\n    count = 2"),
    );
    let (code, out, err) = agent.cli(&["job", "run", &two]);
    assert_ne!(code, 0, "{out}{err}");
    assert!(
        err.contains(
            "a system job runs one alloc of each group per node: count may be 0 or 1, not 2"
        ),
        "{err}"
    );
}
