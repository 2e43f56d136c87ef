//! Evaluations as Nomad's clients follow them: a register, a stop and a dispatch answer
//! with an `EvalID`; python-nomad reads the evaluation until it is complete and lists
//! its allocations; a job that fits nowhere is accepted and its evaluation says which
//! dimension was exhausted.

use berth_harness::AgentProcess;
use berth_testkit::etcd::EtcdServer;
use serde_json::Value;

/// A cluster member on etcd, its API on TCP with the operator's token.
async fn member_on_tcp(etcd: &EtcdServer, name: &str) -> (AgentProcess, String) {
    let endpoint = etcd.endpoint();
    let name = name.to_string();
    let mut agent = AgentProcess::production(move |port, dir| {
        format!(
            "name = \"{name}\"\n\
             cluster {{\n  store = \"etcd\"\n  endpoints = [\"{endpoint}\"]\n  prefix = \"/evals\"\n}}\n\
             http {{\n  address = \"127.0.0.1:{port}\"\n  token_file = \"{}/api-token\"\n}}\n",
            dir.display()
        )
    });
    agent.start().await;
    let token = std::fs::read_to_string(agent.path().join("api-token"))
        .unwrap()
        .trim()
        .to_string();
    (agent, token)
}

const FOLLOW: &str = r#"
import json, sys, time
import nomad

port, token = int(sys.argv[1]), sys.argv[2]
n = nomad.Nomad(host="127.0.0.1", port=port, token=token, timeout=30)
out = {}

def follow(eval_id):
    deadline = time.time() + 30
    while True:
        evaluation = n.evaluation.get_evaluation(eval_id)
        if evaluation["Status"] != "pending" or time.time() > deadline:
            return evaluation
        time.sleep(0.1)

def job(name, memory):
    return {"Job": {"ID": name, "Type": "service", "TaskGroups": [{"Name": "g", "Count": 2,
        "Tasks": [{"Name": "t", "Driver": "mock", "Config": {"run_for": "1h"},
                   "Resources": {"CPU": 20, "MemoryMB": memory}}]}]}}

registered = n.jobs.register_job(job("web", 16))
evaluation = follow(registered["EvalID"])
out["web"] = [evaluation["ID"] == registered["EvalID"], evaluation["Status"],
              evaluation["TriggeredBy"], evaluation["JobID"], evaluation["Type"]]
allocs = n.evaluation.get_allocations(registered["EvalID"])
out["web_allocs"] = sorted(a["Name"] for a in allocs)
out["web_allocs_eval"] = sorted(set(a["EvalID"] for a in allocs)) == [registered["EvalID"]]
out["web_job_allocs"] = sorted(a["ID"] for a in n.job.get_allocations("web")) == sorted(a["ID"] for a in allocs)

too_big = n.jobs.register_job(job("huge", 100000))
evaluation = follow(too_big["EvalID"])
failed = evaluation["FailedTGAllocs"]["g"]
out["huge"] = [evaluation["Status"], failed["NodesEvaluated"], failed["NodesExhausted"],
               sorted(failed["DimensionExhausted"].keys()), evaluation["QueuedAllocations"]]
out["huge_allocs"] = n.evaluation.get_allocations(too_big["EvalID"])

stopped = n.job.deregister_job("web")
evaluation = follow(stopped["EvalID"])
out["stop"] = [evaluation["Status"], evaluation["TriggeredBy"]]

listed = n.evaluations.get_evaluations()
out["listed"] = sorted(e["JobID"] + ":" + e["TriggeredBy"] for e in listed)
out["of_web"] = [e["TriggeredBy"] for e in n.job.get_evaluations("web")]
try:
    n.evaluation.get_evaluation("00000000-0000-4000-8000-000000000000")
    out["missing"] = "found"
except nomad.api.exceptions.URLNotFoundNomadException:
    out["missing"] = "404"
print(json.dumps(out))
"#;

/// python-nomad, unchanged, follows a register's `EvalID` to its allocations on a
/// cluster member.
#[tokio::test(flavor = "multi_thread")]
async fn python_nomad_follows_an_eval_id_to_its_allocations() {
    let etcd = EtcdServer::start();
    let (agent, token) = member_on_tcp(&etcd, "eval-a").await;
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("follow.py");
    std::fs::write(&path, FOLLOW).unwrap();
    let port = agent.port().to_string();
    let output = tokio::task::spawn_blocking(move || {
        std::process::Command::new("python3")
            .arg(&path)
            .arg(&port)
            .arg(&token)
            .output()
    })
    .await
    .unwrap()
    .expect("python3 runs (with python-nomad==2.1.0, which .ci/test installs)");
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        output.status.success(),
        "{stdout}\n{stderr}\n{}",
        agent.output()
    );
    let out: Value = serde_json::from_str(stdout.trim()).unwrap();
    assert_eq!(
        out["web"],
        serde_json::json!([true, "complete", "job-register", "web", "service"])
    );
    assert_eq!(
        out["web_allocs"],
        serde_json::json!(["web.g[0]", "web.g[1]"])
    );
    assert_eq!(out["web_allocs_eval"], true);
    assert_eq!(out["web_job_allocs"], true);
    assert_eq!(
        out["huge"],
        serde_json::json!(["complete", 1, 1, ["memory"], {"g": 2}]),
        "{out:#}"
    );
    assert_eq!(out["huge_allocs"], serde_json::json!([]));
    assert_eq!(
        out["stop"],
        serde_json::json!(["complete", "job-deregister"])
    );
    assert_eq!(
        out["listed"],
        serde_json::json!([
            "huge:job-register",
            "web:job-deregister",
            "web:job-register"
        ])
    );
    assert_eq!(
        out["of_web"],
        serde_json::json!(["job-deregister", "job-register"])
    );
    assert_eq!(out["missing"], "404");
}

/// berth's own submit waits for its evaluation and answers with it and its allocs.
#[tokio::test(flavor = "multi_thread")]
async fn a_submit_answers_with_its_evaluation_and_allocs() {
    let etcd = EtcdServer::start();
    let (agent, _) = member_on_tcp(&etcd, "eval-b").await;
    let source = r#"
job "pair" {
  group "g" {
    count = 2
    task "t" {
      driver = "mock"
      config {
        run_for = "1h"
      }
      resources {
        cpu    = 20
        memory = 16
      }
    }
  }
}
"#;
    let submitted = agent.submit("pair.hcl", source).await.unwrap();
    assert!(berth_cluster::is_uuid(&submitted.eval_id), "{submitted:?}");
    assert_eq!(submitted.alloc_ids.len(), 2, "{submitted:?}");
    // The allocs are this node's at once: each one's status reads.
    for id in &submitted.alloc_ids {
        let status = agent.alloc(id).await;
        assert_eq!(&status.id, id);
    }
    let evaluation: Value = agent
        .client()
        .get(&format!("/v1/evaluation/{}", submitted.eval_id))
        .await
        .unwrap();
    assert_eq!(evaluation["Status"], "complete", "{evaluation:#}");
    // Submitted again, changed: the new evaluation names the old allocs it stopped.
    let again = agent
        .submit("pair.hcl", &source.replace("count = 2", "count = 1"))
        .await
        .unwrap();
    assert_ne!(again.eval_id, submitted.eval_id);
    assert_eq!(again.alloc_ids.len(), 1, "{again:?}");
    let mut replaced = again.replaced.clone();
    replaced.sort();
    let mut before = submitted.alloc_ids.clone();
    before.sort();
    assert_eq!(replaced, before, "{again:?}");
}

/// `berth job run` follows the register's evaluation as `nomad job run` does: the
/// allocs it placed, and, for a job that fits nowhere, what was exhausted, with
/// Nomad's exit code 2.
#[tokio::test(flavor = "multi_thread")]
async fn job_run_follows_the_evaluation_and_says_what_could_not_be_placed() {
    let etcd = EtcdServer::start();
    let (agent, _) = member_on_tcp(&etcd, "eval-c").await;
    let job = |name: &str, memory: u32| {
        format!(
            "job \"{name}\" {{\n  group \"g\" {{\n    count = 2\n    task \"t\" {{\n      \
             driver = \"mock\"\n      config {{\n        run_for = \"1h\"\n      }}\n      \
             resources {{\n        cpu    = 20\n        memory = {memory}\n      }}\n    }}\n  \
             }}\n}}\n"
        )
    };
    let fits = agent.path().join("fits.hcl");
    std::fs::write(&fits, job("fits", 16)).unwrap();
    let (code, out, err) = agent.cli(&["job", "run", "-detach", fits.to_str().unwrap()]);
    assert_eq!(code, 0, "{out}\n{err}");
    assert_eq!(out.matches("    alloc ").count(), 2, "{out}");
    let huge = agent.path().join("huge.hcl");
    std::fs::write(&huge, job("huge", 100_000)).unwrap();
    let (code, out, err) = agent.cli(&["job", "run", huge.to_str().unwrap()]);
    assert_eq!(code, 2, "{out}\n{err}");
    assert!(
        out.contains("failed to place all allocations")
            && out.contains("Task Group \"g\" (failed to place 2 allocations)")
            && out.contains("Dimension \"memory\" exhausted on 1 nodes"),
        "{out}"
    );
}
