//! berth's CLI on Nomad's API: `berth job plan` and Nomad's plan and dispatch endpoints,
//! on one agent.

use berth_harness::AgentProcess;
use serde_json::{Value, json};

const PLANNED: &str = r#"variable "seconds" { type = string }
job "planned" {
  group "g" {
    count = 1
    task "t" {
      driver = "mock"
      config { run_for = "${var.seconds}s" }
    }
  }
}
"#;

const UNPLACEABLE: &str = r#"job "unplaceable" {
  group "web" {
    task "t" {
      driver = "podman"
    }
  }
  group "fine" {
    task "t" {
      driver = "mock"
    }
  }
}
"#;

const LAUNCHER: &str = r#"job "launcher" {
  type = "batch"
  parameterized {
    payload       = "required"
    meta_required = ["format"]
  }
  group "g" {
    task "t" {
      driver = "mock"
      config { run_for = "0s" }
      dispatch_payload { file = "input" }
    }
  }
}
"#;

#[tokio::test(flavor = "multi_thread")]
async fn plan_and_dispatch_answer_in_nomads_shapes_and_the_cli_uses_them() {
    let mut agent = AgentProcess::new();
    agent.start().await;
    let client = agent.client();
    let file = agent.path().join("planned.nomad.hcl");
    std::fs::write(&file, PLANNED).unwrap();
    let file = file.to_str().unwrap();

    // A new job: one alloc to place, nothing recorded.
    let (code, stdout, stderr) = agent.cli(&["job", "plan", "-var", "seconds=600", file]);
    assert_eq!(code, 1, "Nomad's exit code for changes: {stdout}{stderr}");
    assert!(stdout.contains("+ Job: \"planned\""), "{stdout}");
    assert!(
        stdout.contains("+ Task Group: \"g\" (1 create)"),
        "{stdout}"
    );
    assert!(
        stdout.contains("All tasks successfully allocated."),
        "{stdout}"
    );
    let jobs: Vec<Value> = client.get("/v1/jobs").await.unwrap();
    assert!(jobs.is_empty(), "a plan registers nothing: {jobs:?}");

    // Run, then plan the same job again: its running alloc would be replaced.
    let (code, stdout, stderr) = agent.cli(&["job", "run", "-var", "seconds=600", file]);
    assert_eq!(code, 0, "{stdout}{stderr}");
    let (code, stdout, _) = agent.cli(&["job", "plan", "-var", "seconds=600", file]);
    assert_eq!(code, 1, "{stdout}");
    assert!(stdout.contains("  Job: \"planned\""), "unchanged: {stdout}");
    assert!(
        stdout.contains("Task Group: \"g\" (1 create/destroy update)"),
        "{stdout}"
    );

    // A group this node cannot run fails, with the reason; the other is placed.
    let parsed: Value = client
        .post(
            "/v1/jobs/parse",
            &json!({"JobHCL": UNPLACEABLE, "Canonicalize": true}),
        )
        .await
        .unwrap();
    let plan: Value = client
        .post(
            "/v1/job/unplaceable/plan",
            &json!({"Job": parsed, "Diff": true}),
        )
        .await
        .unwrap();
    let failed = &plan["FailedTGAllocs"]["web"];
    assert_eq!(failed["NodesEvaluated"], 1, "{plan:#}");
    let reasons: Vec<&String> = failed["ConstraintFiltered"]
        .as_object()
        .unwrap()
        .keys()
        .collect();
    assert!(
        reasons
            .iter()
            .any(|r| r.contains("unknown driver \"podman\"")),
        "{reasons:?}"
    );
    assert!(plan["FailedTGAllocs"].get("fine").is_none(), "{plan:#}");
    let updates = &plan["Annotations"]["DesiredTGUpdates"];
    assert_eq!(updates["fine"]["Place"], 1, "{plan:#}");
    assert_eq!(updates["web"]["Place"], 0, "{plan:#}");
    assert_eq!(plan["Diff"]["Type"], "Added", "{plan:#}");
    assert_eq!(plan["CreatedEvals"], json!([]));

    // A parameterized job, dispatched through Nomad's endpoint: Go's []byte is base64.
    let launcher = agent.path().join("launcher.nomad.hcl");
    std::fs::write(&launcher, LAUNCHER).unwrap();
    let (code, stdout, stderr) = agent.cli(&["job", "run", launcher.to_str().unwrap()]);
    assert_eq!(code, 0, "{stdout}{stderr}");
    let dispatched: Value = client
        .post(
            "/v1/job/launcher/dispatch",
            &json!({"Payload": "aGVsbG8=", "Meta": {"format": "pdf"}}),
        )
        .await
        .unwrap();
    let child = dispatched["DispatchedJobID"].as_str().unwrap();
    assert!(child.starts_with("launcher/dispatch-"), "{dispatched}");
    assert!(dispatched["JobCreateIndex"].is_u64(), "{dispatched}");
    // The dispatch's evaluation, which Nomad's CLI follows.
    let evaluation: Value = client
        .get(&format!(
            "/v1/evaluation/{}",
            dispatched["EvalID"].as_str().unwrap()
        ))
        .await
        .unwrap();
    assert_eq!(evaluation["JobID"], child, "{evaluation}");
    assert_eq!(evaluation["TriggeredBy"], "job-dispatch", "{evaluation}");
    let Err(berth_api::client::ClientError::Api(error, status)) = client
        .post::<_, Value>(
            "/v1/job/launcher/dispatch",
            &json!({"Meta": {"format": "pdf"}}),
        )
        .await
    else {
        panic!("a dispatch without its required payload was accepted");
    };
    assert_eq!(status.as_u16(), 400);
    assert!(
        error.error.contains("requires a payload"),
        "{}",
        error.error
    );
}
