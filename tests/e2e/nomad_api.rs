//! Nomad's HTTP API on a berth agent, driven by the tools Nomad users have: the
//! python-nomad client library (2.1.0 from PyPI, installed by `.ci/test`), unchanged, and
//! raw HTTP as `curl` sends it. Blocking queries answer at the next change.

use std::io::{Read, Write};
use std::time::{Duration, Instant};

use berth_harness::AgentProcess;

/// A production agent on TCP with its submit token; the token.
async fn agent_on_tcp() -> (AgentProcess, String) {
    let mut agent = AgentProcess::production(|port, dir| {
        format!(
            "http {{\n  address = \"127.0.0.1:{port}\"\n  token_file = \"{}/api-token\"\n  token \"viewer\" {{\n    secret = \"viewer-secret-0123456789\"\n    scope  = \"read\"\n  }}\n}}\n",
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

/// One HTTP/1.1 request as `curl` sends it: status, headers (lowercase names), body.
pub(crate) fn http(
    port: u16,
    method: &str,
    path: &str,
    token: &str,
    body: &str,
) -> (u16, Vec<(String, String)>, String) {
    let mut stream = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
    let request = format!(
        "{method} {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nConnection: close\r\nX-Nomad-Token: {token}\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    );
    stream.write_all(request.as_bytes()).unwrap();
    let mut answer = Vec::new();
    stream.read_to_end(&mut answer).unwrap();
    let answer = String::from_utf8_lossy(&answer).into_owned();
    let (head, body) = answer.split_once("\r\n\r\n").unwrap_or((&answer, ""));
    let mut lines = head.lines();
    let status = lines
        .next()
        .and_then(|l| l.split(' ').nth(1))
        .and_then(|c| c.parse().ok())
        .unwrap_or(0);
    let headers = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(k, v)| (k.trim().to_ascii_lowercase(), v.trim().to_string()))
        .collect();
    // Chunked bodies (long answers) are joined.
    let body = if head
        .to_ascii_lowercase()
        .contains("transfer-encoding: chunked")
    {
        let mut out = String::new();
        let mut rest = body;
        while let Some((size, after)) = rest.split_once("\r\n") {
            let size = usize::from_str_radix(size.trim(), 16).unwrap_or(0);
            if size == 0 || after.len() < size {
                break;
            }
            out.push_str(&after[..size]);
            rest = after[size..].trim_start_matches("\r\n");
        }
        out
    } else {
        body.to_string()
    };
    (status, headers, body)
}

fn header(headers: &[(String, String)], name: &str) -> Option<String> {
    headers
        .iter()
        .find(|(k, _)| k == name)
        .map(|(_, v)| v.clone())
}

/// python-nomad, unchanged, through parse and register (from HCL and from JSON), lists
/// and reads of jobs, allocs and nodes, a blocking query, a task's logs, the agent and
/// status endpoints, stop and purge.
#[tokio::test(flavor = "multi_thread")]
async fn python_nomad_drives_a_berth_agent() {
    let (agent, token) = agent_on_tcp().await;
    let script = r#"
import json, sys, time
import nomad
import nomad.api.exceptions as errors

port, token = int(sys.argv[1]), sys.argv[2]
n = nomad.Nomad(host="127.0.0.1", port=port, token=token, timeout=30)
out = {}
hcl = '''
job "hello" {
  type = "service"
  group "g" {
    task "t" {
      driver = "mock"
      config {
        run_for = "1h"
      }
      env {
        GREETING = "hi"
      }
    }
  }
}
'''
job = n.jobs.parse(hcl, canonicalize=True)
out["parsed"] = [job["ID"], job["TaskGroups"][0]["Tasks"][0]["Driver"]]
registered = n.jobs.register_job({"Job": job})
out["registered"] = sorted(k for k in ("EvalID", "JobModifyIndex", "Index") if k in registered)
n.job.register_job("from-json", {"Job": {"ID": "from-json", "Type": "batch", "TaskGroups": [
    {"Name": "g", "Count": 2, "Tasks": [{"Name": "t", "Driver": "mock", "Config": {"run_for": "0s"}}]}]}})
out["jobs"] = sorted(j["ID"] for j in n.jobs.get_jobs())
out["prefix"] = [j["ID"] for j in n.jobs.get_jobs(prefix="from")]
read = n.job.get_job("hello")
out["job"] = [read["Type"], read["TaskGroups"][0]["Tasks"][0]["Env"]["GREETING"]]

# A blocking query on the job's allocations, until its alloc runs.
index, running, waited = 0, None, 0
deadline = time.time() + 60
while time.time() < deadline and running is None:
    response = n.job.request("hello", "allocations", method="get", params={"index": index, "wait": "10s"})
    index = int(response.headers["X-Nomad-Index"])
    waited += 1
    for alloc in response.json():
        if alloc["ClientStatus"] == "running" and alloc["TaskStates"]["t"]["State"] == "running":
            running = alloc
out["running"] = running is not None and running["JobID"] == "hello"
alloc = n.allocation.get_allocation(running["ID"])
out["alloc"] = [alloc["TaskGroup"], alloc["Job"]["ID"], [e["Type"] for e in alloc["TaskStates"]["t"]["Events"]][:2]]
out["allocs"] = len([a for a in n.allocations.get_allocations() if a["JobID"] == "from-json"])
out["versions"] = [v["ID"] for v in n.job.get_versions("hello")["Versions"]]
out["evaluations"] = [[e["TriggeredBy"], e["Status"], e["ID"] == registered["EvalID"]] for e in n.job.get_evaluations("hello")]
followed = n.evaluation.get_evaluation(registered["EvalID"])
out["followed"] = [followed["JobID"], followed["Status"], [a["JobID"] for a in n.evaluation.get_allocations(registered["EvalID"])]]
out["deployments"] = n.job.get_deployments("hello")
summary = n.job.get_summary("from-json")
out["summary_groups"] = sorted(summary["Summary"].keys())

# Logs of a finished exec task, plain and framed, from the start and from the end.
n.jobs.register_job({"Job": {"ID": "say", "Type": "batch", "TaskGroups": [{"Name": "g", "Tasks": [
    {"Name": "t", "Driver": "exec", "Config": {"command": "/bin/echo", "args": ["hello-from-berth"]}}]}]}})
said, index = None, 0
deadline = time.time() + 60
while time.time() < deadline and said is None:
    response = n.job.request("say", "allocations", method="get", params={"index": index, "wait": "10s"})
    index = int(response.headers["X-Nomad-Index"])
    said = next((a for a in response.json() if a["ClientStatus"] == "complete"), None)
import base64
logs = n.client.stream_logs
out["logs"] = [
    logs.stream(said["ID"], "t", "stdout", plain=True),
    logs.stream(said["ID"], "t", "stdout", offset=5, origin="end", plain=True),
    base64.b64decode(json.loads(logs.stream(said["ID"], "t", "stdout"))["Data"]).decode(),
]
try:
    logs.stream(said["ID"], "nosuchtask", "stdout", plain=True)
    out["logs_unknown_task"] = "found"
except errors.URLNotFoundNomadException:
    out["logs_unknown_task"] = "404"

nodes = n.nodes.get_nodes()
node = n.node.get_node(nodes[0]["ID"])
out["node"] = [len(nodes), node["Status"], node["Attributes"]["kernel.name"], "mock" in node["Drivers"]]
out["agent"] = n.agent.get_agent()["config"]["Region"]
out["leader"] = n.status.leader.get_leader() != ""
out["regions"] = n.regions.get_regions()

n.job.deregister_job("hello", purge=True)
out["purged"] = False
deadline = time.time() + 60
while time.time() < deadline and not out["purged"]:
    try:
        n.job.get_job("hello")
        time.sleep(0.2)
    except errors.URLNotFoundNomadException:
        out["purged"] = True
try:
    n.job.get_job("no-such-job")
    out["unknown"] = "found"
except errors.URLNotFoundNomadException as e:
    out["unknown"] = e.nomad_resp.text
print(json.dumps(out))
"#;
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("drive.py");
    std::fs::write(&path, script).unwrap();
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
    let out: serde_json::Value = serde_json::from_str(stdout.trim()).unwrap();
    assert_eq!(out["parsed"], serde_json::json!(["hello", "mock"]));
    assert_eq!(
        out["registered"],
        serde_json::json!(["EvalID", "Index", "JobModifyIndex"])
    );
    assert_eq!(out["jobs"], serde_json::json!(["from-json", "hello"]));
    assert_eq!(out["prefix"], serde_json::json!(["from-json"]));
    assert_eq!(out["job"], serde_json::json!(["service", "hi"]));
    assert_eq!(out["running"], true, "{out}");
    assert_eq!(
        out["alloc"],
        serde_json::json!(["g", "hello", ["Received", "Task Setup"]])
    );
    assert_eq!(out["allocs"], 2);
    assert_eq!(out["versions"], serde_json::json!(["hello"]));
    assert_eq!(
        out["evaluations"],
        serde_json::json!([["job-register", "complete", true]])
    );
    // The register's EvalID followed to its alloc, as Nomad's clients do.
    assert_eq!(
        out["followed"],
        serde_json::json!(["hello", "complete", ["hello"]])
    );
    assert_eq!(out["deployments"], serde_json::json!([]));
    assert_eq!(out["summary_groups"], serde_json::json!(["g"]));
    assert_eq!(
        out["logs"],
        serde_json::json!(["hello-from-berth\n", "erth\n", "hello-from-berth\n"])
    );
    assert_eq!(out["logs_unknown_task"], "404");
    assert_eq!(out["node"], serde_json::json!([1, "ready", "linux", true]));
    assert_eq!(out["agent"], "global");
    assert_eq!(out["leader"], true);
    assert_eq!(out["regions"], serde_json::json!(["global"]));
    assert_eq!(out["purged"], true);
    assert_eq!(out["unknown"], "job not found");
}

/// A blocking query waits while nothing changes and answers at the next change, with
/// the new index; an index from before answers at once.
#[tokio::test(flavor = "multi_thread")]
async fn a_blocking_query_answers_at_the_next_change() {
    let (agent, token) = agent_on_tcp().await;
    let port = agent.port();
    let (status, headers, body) = http(port, "GET", "/v1/jobs", &token, "");
    assert_eq!((status, body.as_str()), (200, "[]"));
    let index: u64 = header(&headers, "x-nomad-index").unwrap().parse().unwrap();
    assert_eq!(
        header(&headers, "x-nomad-knownleader").as_deref(),
        Some("true")
    );

    // Nothing changes: the wait runs out and the index is the same. A fresh agent may
    // still be settling (its node's first reports): an early answer must then carry a
    // newer index, and the wait is tried again from it.
    let mut index = index;
    let mut settled = false;
    for _ in 0..5 {
        let started = Instant::now();
        let (_, headers, _) = http(
            port,
            "GET",
            &format!("/v1/jobs?index={index}&wait=1s"),
            &token,
            "",
        );
        let answered: u64 = header(&headers, "x-nomad-index").unwrap().parse().unwrap();
        if started.elapsed() >= Duration::from_secs(1) {
            assert_eq!(answered, index, "the wait ran out: the index is the same");
            settled = true;
            break;
        }
        assert!(answered > index, "answered early at the same index {index}");
        index = answered;
    }
    assert!(settled, "the index never stayed the same for a second");

    // A change while one waits: it answers then.
    let waiting_token = token.clone();
    let waiting = std::thread::spawn(move || {
        let (_, headers, body) = http(
            port,
            "GET",
            &format!("/v1/jobs?index={index}&wait=60s"),
            &waiting_token,
            "",
        );
        (Instant::now(), headers, body)
    });
    std::thread::sleep(Duration::from_millis(500));
    assert!(!waiting.is_finished(), "answered before anything changed");
    let job = serde_json::json!({"Job": {"ID": "b", "Type": "batch", "TaskGroups": [
        {"Name": "g", "Tasks": [{"Name": "t", "Driver": "mock", "Config": {"run_for": "0s"}}]}]}});
    let (status, _, body) = http(port, "PUT", "/v1/jobs", &token, &job.to_string());
    assert_eq!(status, 200, "{body}");
    let registered = Instant::now();
    let (answered, headers, body) = waiting.join().unwrap();
    let after = answered.saturating_duration_since(registered);
    assert!(
        after < Duration::from_secs(2),
        "answered {after:?} after the change"
    );
    assert!(
        header(&headers, "x-nomad-index")
            .unwrap()
            .parse::<u64>()
            .unwrap()
            > index
    );
    assert!(body.contains("\"ID\":\"b\""), "{body}");
    // The job's own indexes are in the same scale, never ahead of the index served.
    let (_, headers, body) = http(port, "GET", "/v1/job/b", &token, "");
    let job: serde_json::Value = serde_json::from_str(&body).unwrap();
    let served: u64 = header(&headers, "x-nomad-index").unwrap().parse().unwrap();
    assert!(
        job["JobModifyIndex"].as_u64().unwrap() <= served,
        "{body} at {served}"
    );

    // An index from the past answers at once.
    let started = Instant::now();
    http(
        port,
        "GET",
        &format!("/v1/jobs?index={}&wait=60s", index - 1),
        &token,
        "",
    );
    assert!(started.elapsed() < Duration::from_secs(5));
    let (status, _, body) = http(port, "GET", "/v1/jobs?index=soon", &token, "");
    assert_eq!(
        (status, body.as_str()),
        (400, "Invalid index: \"soon\" is not a number")
    );
}

/// Nomad's token header and scopes, its plain-text errors, and a 404 that names the
/// nearest endpoint, not a source file.
#[tokio::test(flavor = "multi_thread")]
async fn tokens_errors_and_unknown_paths_as_nomad_has_them() {
    let (agent, token) = agent_on_tcp().await;
    let port = agent.port();
    let viewer = "viewer-secret-0123456789";
    assert_eq!(http(port, "GET", "/v1/jobs", viewer, "").0, 200);
    assert_eq!(
        http(port, "GET", "/v1/jobs", "wrong-secret-0123456789", "").0,
        403
    );
    let job = r#"{"Job": {"ID": "v", "TaskGroups": [{"Name": "g", "Tasks": [{"Name": "t", "Driver": "mock"}]}]}}"#;
    assert_eq!(http(port, "PUT", "/v1/jobs", viewer, job).0, 403);
    let (status, headers, body) = http(port, "GET", "/v1/job/nope", &token, "");
    assert_eq!((status, body.as_str()), (404, "job not found"));
    assert!(
        header(&headers, "content-type")
            .unwrap()
            .starts_with("text/plain")
    );
    let (status, _, body) = http(port, "GET", "/v1/jobz", &token, "");
    assert_eq!(status, 404);
    assert!(
        body.contains("the nearest berth serves is /v1/jobs"),
        "{body}"
    );
    assert!(!body.contains(".rs"), "{body}");
    let (status, _, body) = http(
        port,
        "PUT",
        "/v1/jobs",
        &token,
        r#"{"Job": {"ID": "x", "TaskGroups": 3}}"#,
    );
    assert_eq!(
        (status, body.as_str()),
        (400, "Job.TaskGroups must be a list")
    );
    let (status, _, body) = http(port, "PUT", "/v1/jobs", &token, "{not json");
    assert_eq!(status, 400);
    assert!(body.starts_with("Failed to decode request"), "{body}");
    // A job the front end refuses is refused with its problems, and nothing is kept.
    let bad = r#"{"Job": {"ID": "bad", "TaskGroups": [{"Name": "g", "Tasks": [{"Name": "t", "Driver": "nosuch"}]}]}}"#;
    let (status, _, body) = http(port, "PUT", "/v1/jobs", &token, bad);
    assert_eq!(status, 400);
    assert!(body.contains("nosuch"), "{body}");
    assert_eq!(http(port, "GET", "/v1/job/bad", &token, "").0, 404);
}

/// Purge answers at once, as Nomad's does, even for a job whose tasks take their
/// `kill_timeout` to stop: the job is gone at once, and its alloc stops on its node,
/// its task given the whole timeout.
#[tokio::test(flavor = "multi_thread")]
async fn a_slow_purge_answers_at_once_and_its_alloc_stops_in_its_own_time() {
    let (agent, token) = agent_on_tcp().await;
    let port = agent.port();
    let job = serde_json::json!({"Job": {"ID": "slow", "Type": "service", "TaskGroups": [{"Name": "g",
        "Tasks": [{"Name": "t", "Driver": "exec", "KillTimeout": 12_000_000_000u64,
            "Config": {"command": "/bin/sh", "args": ["-c", "trap '' INT TERM; while true; do sleep 1; done"]}}]}]}});
    let (status, _, body) = http(port, "PUT", "/v1/jobs", &token, &job.to_string());
    assert_eq!(status, 200, "{body}");
    let deadline = Instant::now() + Duration::from_secs(60);
    let alloc = loop {
        let (_, _, body) = http(port, "GET", "/v1/job/slow/allocations", &token, "");
        if body.contains("\"State\":\"running\"") {
            let allocs: serde_json::Value = serde_json::from_str(&body).unwrap();
            break allocs[0]["ID"].as_str().unwrap().to_string();
        }
        assert!(Instant::now() < deadline, "never ran: {body}");
        std::thread::sleep(Duration::from_millis(100));
    };
    let started = Instant::now();
    let (status, _, body) = http(port, "DELETE", "/v1/job/slow?purge=true", &token, "");
    assert_eq!(status, 200, "{body}");
    // Before the task's 12 s kill timeout, with room for a loaded machine (the purge
    // waits 5 s at most for allocs that stop at once; a CI run under load once took 7.03 s
    // against an earlier 7 s bound).
    assert!(
        started.elapsed() < Duration::from_secs(10),
        "{:?}",
        started.elapsed()
    );
    let (status, _, body) = http(port, "GET", "/v1/job/slow", &token, "");
    assert_eq!(status, 404, "not purged: {body}");
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        // Stopped: complete, or already collected with its purged job.
        let (status, _, body) = http(port, "GET", &format!("/v1/allocation/{alloc}"), &token, "");
        if status == 404 || body.contains("\"ClientStatus\":\"complete\"") {
            break;
        }
        assert!(Instant::now() < deadline, "its alloc never stopped: {body}");
        std::thread::sleep(Duration::from_millis(200));
    }
    assert!(
        started.elapsed() >= Duration::from_secs(11),
        "its task was not given its kill timeout: {:?}",
        started.elapsed()
    );
}
