//! Jobs have owners: the operator, or the `token "x"` block that first submitted the job.
//! Another token is refused (403, naming the owner) when it stops, purges, replaces or
//! launches from a job, or stops, restarts or signals its allocs, through Nomad's paths
//! and berth's; the owner and the operator may. The owner is kept with the job's record across a restart.

use std::time::{Duration, Instant};

use serde_json::json;

use berth_harness::AgentProcess;
use berth_testkit::etcd::EtcdServer;

use crate::nomad_api::http;

const TEAM_A: &str = "team-a-secret-0123456789";
const TEAM_B: &str = "team-b-secret-0123456789";

fn service(name: &str) -> String {
    format!(
        "job \"{name}\" {{\n  group \"g\" {{\n    task \"t\" {{\n      driver = \"mock\"\n      \
         config {{\n        run_for = \"600s\"\n      }}\n    }}\n  }}\n}}\n"
    )
}

fn parameterized(name: &str) -> String {
    format!(
        "job \"{name}\" {{\n  type = \"batch\"\n  parameterized {{\n    payload = \"optional\"\n  }}\n  \
         group \"g\" {{\n    task \"t\" {{\n      driver = \"mock\"\n      config {{\n        \
         run_for = \"0s\"\n      }}\n    }}\n  }}\n}}\n"
    )
}

/// What `nomad job run` registers for [`service`]`(name)`.
fn nomad_job(name: &str) -> String {
    json!({"Job": {"ID": name, "Name": name, "Type": "service", "TaskGroups": [{"Name": "g",
        "Count": 1, "Tasks": [{"Name": "t", "Driver": "mock", "Config": {"run_for": "600s"}}]}]}})
    .to_string()
}

/// What `berth job run` sends.
fn berth_submit(name: &str, source: &str) -> String {
    json!({"source_name": format!("{name}.hcl"), "source": source}).to_string()
}

/// The error of an answer: berth's paths answer `{"error": ...}`, Nomad's plain text.
fn error_text(body: &str) -> String {
    serde_json::from_str::<serde_json::Value>(body)
        .ok()
        .and_then(|v| v["error"].as_str().map(str::to_string))
        .unwrap_or_else(|| body.to_string())
}

/// One request over TCP with `token`: status and body.
async fn call(port: u16, method: &str, path: &str, token: &str, body: &str) -> (u16, String) {
    let (method, path, token, body) = (
        method.to_string(),
        path.to_string(),
        token.to_string(),
        body.to_string(),
    );
    tokio::task::spawn_blocking(move || {
        let (status, _, body) = http(port, &method, &path, &token, &body);
        (status, body)
    })
    .await
    .unwrap()
}

/// Every change of `job` (a service) and `batch` (parameterized) that `secret` (the
/// token named `token`) asks for is refused with 403, naming `owner`.
async fn refused_all(
    agent: &AgentProcess,
    secret: &str,
    token: &str,
    job: &str,
    batch: &str,
    owner: &str,
) {
    let port = agent.port();
    let status: serde_json::Value = agent
        .client()
        .get(&format!("/v1/berth/job/{job}"))
        .await
        .unwrap();
    let alloc = status["allocs"][0]["id"].as_str().unwrap().to_string();
    let mut requests = vec![
        (
            "POST",
            format!("/v1/allocation/{alloc}/stop"),
            String::new(),
            job.to_string(),
            "stop an alloc of",
        ),
        (
            "POST",
            format!("/v1/client/allocation/{alloc}/restart"),
            "{}".into(),
            job.to_string(),
            "restart an alloc of",
        ),
        (
            "POST",
            format!("/v1/client/allocation/{alloc}/signal"),
            r#"{"Signal": "SIGHUP"}"#.into(),
            job.to_string(),
            "signal an alloc of",
        ),
    ];
    requests.extend(job_level(job, batch));
    expect_refused(port, secret, token, owner, requests).await;
}

/// A request a token should be refused: method, path, body, the job it is for, and what
/// the refusal calls it.
type Request = (&'static str, String, String, String, &'static str);

/// Each change of `job` (a service) and `batch` (parameterized) itself.
fn job_level(job: &str, batch: &str) -> Vec<Request> {
    let (job, batch) = (job.to_string(), batch.to_string());
    vec![
        (
            "DELETE",
            format!("/v1/job/{job}?purge=true"),
            String::new(),
            job.clone(),
            "purge",
        ),
        (
            "DELETE",
            format!("/v1/job/{job}"),
            String::new(),
            job.clone(),
            "stop",
        ),
        (
            "POST",
            "/v1/jobs".to_string(),
            nomad_job(&job),
            job.clone(),
            "replace",
        ),
        (
            "PUT",
            format!("/v1/job/{job}"),
            nomad_job(&job),
            job.clone(),
            "replace",
        ),
        // A plan is refused as its register would be.
        (
            "POST",
            format!("/v1/job/{job}/plan"),
            nomad_job(&job),
            job.clone(),
            "replace",
        ),
        (
            "POST",
            format!("/v1/job/{batch}/dispatch"),
            "{}".into(),
            batch.clone(),
            "dispatch",
        ),
        (
            "DELETE",
            format!("/v1/berth/job/{job}"),
            String::new(),
            job.clone(),
            "stop",
        ),
        (
            "POST",
            "/v1/berth/jobs".into(),
            berth_submit(&job, &service(&job)),
            job.clone(),
            "replace",
        ),
        (
            "POST",
            format!("/v1/berth/job/{batch}/dispatch"),
            "{}".into(),
            batch.clone(),
            "dispatch",
        ),
        (
            "POST",
            format!("/v1/berth/job/{batch}/periodic/force"),
            String::new(),
            batch.clone(),
            "force a launch of",
        ),
    ]
}

/// Each request by `secret` (the token named `token`) is refused with 403, naming
/// `owner`.
async fn expect_refused(port: u16, secret: &str, token: &str, owner: &str, requests: Vec<Request>) {
    for (method, path, body, target, action) in requests {
        let (status, answer) = call(port, method, &path, secret, &body).await;
        let answer = error_text(&answer);
        let expected =
            format!("job \"{target}\" belongs to {owner}; token \"{token}\" may not {action} it");
        assert_eq!(status, 403, "{method} {path} by {token}: {answer}");
        assert!(
            answer.contains(&expected),
            "{method} {path} by {token}: {answer}"
        );
    }
}

/// The job is listed, not stopped, with an alloc that has not been asked to stop.
async fn still_running(agent: &AgentProcess, job: &str) {
    let status: serde_json::Value = agent
        .client()
        .get(&format!("/v1/berth/job/{job}"))
        .await
        .unwrap();
    assert_eq!(status["stopped"], json!(false), "{job}: {status}");
    let allocs = status["allocs"].as_array().cloned().unwrap_or_default();
    assert!(
        allocs.iter().any(|a| a["desired_status"] == json!("run")),
        "{job}: {status}"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn only_a_jobs_owner_and_the_operator_stop_purge_replace_or_dispatch_it() {
    let mut agent = AgentProcess::production(|port, _| {
        format!(
            "http {{\n  address = \"127.0.0.1:{port}\"\n  token \"team-a\" {{\n    secret = \"{TEAM_A}\"\n    \
             scope  = \"submit\"\n  }}\n  token \"team-b\" {{\n    secret = \"{TEAM_B}\"\n    \
             scope  = \"submit\"\n  }}\n}}\n"
        )
    });
    agent.start().await;
    let port = agent.port();
    let operator = agent.client();

    // The operator's jobs, through the Unix socket.
    for (name, source) in [
        ("op-web", service("op-web")),
        ("op-batch", parameterized("op-batch")),
    ] {
        agent.submit(&format!("{name}.hcl"), &source).await.unwrap();
    }
    // Team A's, through Nomad's path and berth's.
    let (status, body) = call(port, "POST", "/v1/jobs", TEAM_A, &nomad_job("a-web")).await;
    assert_eq!(status, 200, "{body}");
    let (status, body) = call(
        port,
        "POST",
        "/v1/berth/jobs",
        TEAM_A,
        &berth_submit("a-batch", &parameterized("a-batch")),
    )
    .await;
    assert_eq!(status, 200, "{body}");

    // Team B touches neither the operator's jobs nor team A's; team A not the operator's.
    refused_all(
        &agent,
        TEAM_B,
        "team-b",
        "op-web",
        "op-batch",
        "the operator",
    )
    .await;
    refused_all(
        &agent,
        TEAM_A,
        "team-a",
        "op-web",
        "op-batch",
        "the operator",
    )
    .await;
    refused_all(
        &agent,
        TEAM_B,
        "team-b",
        "a-web",
        "a-batch",
        "token \"team-a\"",
    )
    .await;
    still_running(&agent, "op-web").await;
    still_running(&agent, "a-web").await;
    // Collecting the node's finished allocs (every owner's) is the operator's.
    let (status, body) = call(port, "POST", "/v1/berth/system/gc", TEAM_B, "").await;
    assert_eq!(status, 403, "{body}");
    assert!(
        error_text(&body).contains("token \"team-b\" may not collect"),
        "{body}"
    );
    let collected: serde_json::Value = operator.post("/v1/berth/system/gc", &()).await.unwrap();
    assert!(collected["collected"].is_array(), "{collected}");

    // The owner replaces and dispatches its jobs; a child is its parent's owner's.
    let (status, body) = call(port, "PUT", "/v1/job/a-web", TEAM_A, &nomad_job("a-web")).await;
    assert_eq!(status, 200, "{body}");
    let (status, body) = call(port, "POST", "/v1/job/a-batch/dispatch", TEAM_A, "{}").await;
    assert_eq!(status, 200, "{body}");
    let child = serde_json::from_str::<serde_json::Value>(&body).unwrap()["DispatchedJobID"]
        .as_str()
        .unwrap()
        .to_string();
    let (status, body) = call(
        port,
        "DELETE",
        &format!("/v1/berth/job/{}", child.replace('/', "%2F")),
        TEAM_B,
        "",
    )
    .await;
    assert_eq!(status, 403, "{body}");
    assert!(
        error_text(&body).contains(&format!(
            "job \"{child}\" belongs to token \"team-a\"; token \"team-b\" may not stop it"
        )),
        "{body}"
    );
    // The operator dispatches anyone's job.
    let (status, body) = call(port, "POST", "/v1/berth/job/a-batch/dispatch", TEAM_A, "{}").await;
    assert_eq!(status, 200, "{body}");
    let _: serde_json::Value = operator
        .post("/v1/berth/job/a-batch/dispatch", &json!({}))
        .await
        .unwrap();
    let _: serde_json::Value = operator
        .post("/v1/berth/job/op-batch/dispatch", &json!({}))
        .await
        .unwrap();

    // Owners are kept with the jobs' records: a restarted agent still refuses.
    agent.terminate(Duration::from_secs(30));
    agent.start().await;
    refused_all(
        &agent,
        TEAM_B,
        "team-b",
        "a-web",
        "a-batch",
        "token \"team-a\"",
    )
    .await;
    refused_all(
        &agent,
        TEAM_B,
        "team-b",
        "op-web",
        "op-batch",
        "the operator",
    )
    .await;

    // The owner stops and purges its job; the name is then free for anyone.
    let (status, body) = call(port, "DELETE", "/v1/job/a-web?purge=true", TEAM_A, "").await;
    assert_eq!(status, 200, "{body}");
    let deadline = Instant::now() + Duration::from_secs(30);
    while call(port, "GET", "/v1/job/a-web", TEAM_A, "").await.0 != 404 {
        assert!(Instant::now() < deadline, "a-web was never purged");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let (status, body) = call(port, "POST", "/v1/jobs", TEAM_B, &nomad_job("a-web")).await;
    assert_eq!(status, 200, "{body}");
    let (status, body) = call(port, "DELETE", "/v1/job/a-web", TEAM_A, "").await;
    assert_eq!(status, 403, "{body}");
    assert_eq!(
        body,
        "job \"a-web\" belongs to token \"team-b\"; token \"team-a\" may not stop it"
    );

    // The operator stops and purges anyone's jobs, and replaces them.
    let (status, body) = call(port, "DELETE", "/v1/job/a-batch", TEAM_A, "").await;
    assert_eq!(status, 200, "{body}");
    agent.submit("a-web.hcl", &service("a-web")).await.unwrap();
    for job in ["a-web", "a-batch", "op-web", "op-batch"] {
        let _: serde_json::Value = operator
            .delete(&format!("/v1/job/{job}?purge=true"))
            .await
            .unwrap();
    }
}

/// In a cluster the owner is kept in the cluster's job record: another token is refused
/// there too, and a job written by no agent's submit keeps its owner through a stop.
#[tokio::test(flavor = "multi_thread")]
async fn in_a_cluster_only_a_jobs_owner_and_the_operator_stop_purge_replace_or_dispatch_it() {
    let etcd = EtcdServer::start();
    let endpoint = etcd.endpoint();
    let mut agent = AgentProcess::production(move |port, _| {
        format!(
            "name = \"node-a\"\ncluster {{\n  store = \"etcd\"\n  endpoints = [\"{endpoint}\"]\n  \
             prefix = \"/e2e-owners\"\n  heartbeat_ttl = \"2s\"\n}}\n\
             http {{\n  address = \"127.0.0.1:{port}\"\n  token \"team-a\" {{\n    secret = \"{TEAM_A}\"\n    \
             scope  = \"submit\"\n  }}\n  token \"team-b\" {{\n    secret = \"{TEAM_B}\"\n    \
             scope  = \"submit\"\n  }}\n}}\n"
        )
    });
    agent.start().await;
    let port = agent.port();
    for (name, source) in [
        ("op-web", service("op-web")),
        ("op-batch", parameterized("op-batch")),
    ] {
        agent.submit(&format!("{name}.hcl"), &source).await.unwrap();
    }
    let (status, body) = call(port, "POST", "/v1/jobs", TEAM_A, &nomad_job("a-web")).await;
    assert_eq!(status, 200, "{body}");
    let (status, body) = call(
        port,
        "POST",
        "/v1/berth/jobs",
        TEAM_A,
        &berth_submit("a-batch", &parameterized("a-batch")),
    )
    .await;
    assert_eq!(status, 200, "{body}");
    // The periodic force path answers only on a lone agent's own jobs; the rest all go
    // through the cluster's record.
    let cluster_level = |job: &str, batch: &str| -> Vec<Request> {
        job_level(job, batch)
            .into_iter()
            .filter(|(_, path, ..)| !path.ends_with("/periodic/force"))
            .collect()
    };
    expect_refused(
        port,
        TEAM_B,
        "team-b",
        "the operator",
        cluster_level("op-web", "op-batch"),
    )
    .await;
    expect_refused(
        port,
        TEAM_B,
        "team-b",
        "token \"team-a\"",
        cluster_level("a-web", "a-batch"),
    )
    .await;
    let job: serde_json::Value = agent.client().get("/v1/job/op-web").await.unwrap();
    assert_eq!(job["Stop"], json!(false), "{job}");

    // The owner replaces, dispatches, stops and purges; the operator stops anyone's.
    let (status, body) = call(port, "PUT", "/v1/job/a-web", TEAM_A, &nomad_job("a-web")).await;
    assert_eq!(status, 200, "{body}");
    let (status, body) = call(port, "POST", "/v1/job/a-batch/dispatch", TEAM_A, "{}").await;
    assert_eq!(status, 200, "{body}");
    let (status, body) = call(port, "DELETE", "/v1/job/a-web", TEAM_A, "").await;
    assert_eq!(status, 200, "{body}");
    // Stopped, it is still team A's.
    expect_refused(
        port,
        TEAM_B,
        "team-b",
        "token \"team-a\"",
        cluster_level("a-web", "a-batch")
            .into_iter()
            .filter(|(method, path, ..)| *method == "DELETE" && path.contains("purge"))
            .collect(),
    )
    .await;
    let (status, body) = call(port, "DELETE", "/v1/job/a-web?purge=true", TEAM_A, "").await;
    assert_eq!(status, 200, "{body}");
    for job in ["a-batch", "op-web", "op-batch"] {
        let _: serde_json::Value = agent
            .client()
            .delete(&format!("/v1/job/{job}?purge=true"))
            .await
            .unwrap();
    }
}
