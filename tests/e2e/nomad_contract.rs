//! berth's answers against Nomad's documented shapes (`tests/fixtures/nomad/`, one file
//! per endpoint, each naming the page of Nomad's API docs it was written from). One dev
//! agent: the request fixtures go through berth (parse, register, plan, dispatch), and
//! every field of a response fixture must be in berth's live answer with the same JSON
//! type, recursively, except the fields [`ABSENT`] names as deliberately left out. The
//! comparison's rules are `berth_testkit::nomad_fixtures`'s.

use std::time::{Duration, Instant};

use serde_json::{Value, json};

use crate::csi::CsiSteps as _;
use crate::nomad_api::http;
use berth_testkit::nomad_fixtures::{differences, fixture, fixture_names, generic};

/// Fields of each fixture berth deliberately does not fill, with why: the Nomad types'
/// own list (a field the types do not name no handler can fill).
const ABSENT: &[(&str, &[&str], &str)] = berth_testkit::nomad_fixtures::NOT_IN_BERTH;

struct Contract {
    port: u16,
    problems: Vec<String>,
    /// Names that stand for "any name" in reported paths (job, group and task names).
    names: Vec<String>,
    checked: Vec<&'static str>,
}

impl Contract {
    fn call(&self, method: &str, path: &str, body: &Value) -> Value {
        let body = if body.is_null() {
            String::new()
        } else {
            body.to_string()
        };
        let (status, _, answer) = http(self.port, method, path, "", &body);
        assert_eq!(status, 200, "{method} {path}: {answer}");
        serde_json::from_str(&answer)
            .unwrap_or_else(|e| panic!("{method} {path}: not JSON ({e}): {answer}"))
    }

    /// Compares berth's answer with fixture `name`'s response.
    fn check(&mut self, name: &'static str, answer: &Value) {
        let fixture = fixture(name);
        let absent: Vec<&str> = ABSENT
            .iter()
            .filter(|(fixture, _, _)| *fixture == name)
            .flat_map(|(_, fields, _)| fields.iter().copied())
            .collect();
        let mut found = Vec::new();
        differences("", &fixture["Response"], answer, &[], &mut found);
        for problem in found {
            let (path, why) = problem.split_once(": ").unwrap_or((&problem, ""));
            let path = generic(path, &self.names);
            if !absent
                .iter()
                .any(|field| path == *field || path.starts_with(&format!("{field}.")))
            {
                self.problems.push(format!("{name}: {path}: {why}"));
            }
        }
        self.checked.push(name);
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn berths_answers_have_the_shapes_of_nomads_docs() {
    // The CSI tests' agent, to run the reference plugin for a volume to read.
    let mut agent = crate::csi::agent();
    agent.start().await;
    let mut contract = Contract {
        port: agent.port(),
        problems: Vec::new(),
        names: ["cache", "redis", "param", "t", "g", "volume-id1"]
            .map(String::from)
            .to_vec(),
        checked: Vec::new(),
    };

    // Parse: Nomad's sample payload. FIXME: Nomad's parse only parses, and answers its
    // sample (a group without tasks); berth's validates too and refuses it, so the shape
    // is checked on the sample with one task added.
    let mut parse = fixture("job_parse_request")["Request"].clone();
    let (status, _, answer) = http(
        contract.port,
        "POST",
        "/v1/jobs/parse",
        "",
        &parse.to_string(),
    );
    assert_eq!(status, 400, "{answer}");
    assert!(
        answer.contains("a group needs at least one task"),
        "{answer}"
    );
    parse["JobHCL"] = json!(parse["JobHCL"].as_str().unwrap().replace(
        "group \"cache\" {}",
        "group \"cache\" {\n    task \"t\" {\n      driver = \"mock\"\n    }\n  }"
    ));
    let parsed = contract.call("POST", "/v1/jobs/parse", &parse);
    assert_eq!(
        (parsed["ID"].as_str(), parsed["Type"].as_str()),
        (Some("example"), Some("service"))
    );
    contract.check("job_parse_request", &parsed);

    // Register: Nomad's sample payload, its docker task run by the mock driver.
    let mut register = fixture("job_register_request")["Request"].clone();
    let task = &mut register["Job"]["TaskGroups"][0]["Tasks"][0];
    task["Driver"] = json!("mock");
    task["Config"] = json!({"run_for": "1h"});
    let registered = contract.call("PUT", "/v1/jobs", &register);
    contract.check("job_register_request", &registered);
    let job = contract.call("GET", "/v1/job/cache", &Value::Null);
    let sent = &register["Job"];
    for (read, wrote) in [
        (&job["ID"], &sent["ID"]),
        (&job["Datacenters"], &sent["Datacenters"]),
        (
            &job["TaskGroups"][0]["Name"],
            &sent["TaskGroups"][0]["Name"],
        ),
        (
            &job["TaskGroups"][0]["Tasks"][0]["Name"],
            &sent["TaskGroups"][0]["Tasks"][0]["Name"],
        ),
        (
            &job["TaskGroups"][0]["Tasks"][0]["Driver"],
            &sent["TaskGroups"][0]["Tasks"][0]["Driver"],
        ),
        (
            &job["TaskGroups"][0]["Tasks"][0]["Config"],
            &sent["TaskGroups"][0]["Tasks"][0]["Config"],
        ),
    ] {
        assert_eq!(
            read, wrote,
            "the registered job reads back as sent: {job:#}"
        );
    }

    // Its alloc running.
    let deadline = Instant::now() + Duration::from_secs(30);
    let alloc_id = loop {
        let allocs = contract.call("GET", "/v1/job/cache/allocations", &Value::Null);
        let running = allocs.as_array().and_then(|allocs| {
            allocs
                .iter()
                .find(|a| a["TaskStates"]["redis"]["State"] == "running")
        });
        if let Some(alloc) = running {
            break alloc["ID"].as_str().unwrap().to_string();
        }
        assert!(
            Instant::now() < deadline,
            "the job's alloc never ran: {allocs:#}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    };

    let answer = contract.call("GET", "/v1/jobs", &Value::Null);
    contract.check("jobs_list", &answer);
    contract.check("job_read", &job);
    let answer = contract.call("GET", "/v1/job/cache/summary", &Value::Null);
    contract.check("job_summary", &answer);
    let answer = contract.call("GET", "/v1/allocations", &Value::Null);
    contract.check("allocations_list", &answer);
    let answer = contract.call("GET", &format!("/v1/allocation/{alloc_id}"), &Value::Null);
    contract.check("allocation_read", &answer);
    let nodes = contract.call("GET", "/v1/nodes", &Value::Null);
    let node_id = nodes[0]["ID"].as_str().unwrap().to_string();
    let answer = contract.call("GET", &format!("/v1/node/{node_id}"), &Value::Null);
    contract
        .names
        .extend(answer["Drivers"].as_object().unwrap().keys().cloned());
    contract.check("node_read", &answer);
    let answer = contract.call("GET", "/v1/metrics", &Value::Null);
    contract.check("metrics", &answer);
    let answer = contract.call(
        "GET",
        &format!("/v1/client/allocation/{alloc_id}/stats"),
        &Value::Null,
    );
    contract.check("alloc_stats", &answer);

    // Plan: the payload's fields around the job as berth reads it.
    let mut plan = fixture("job_plan")["Request"].clone();
    plan["Job"] = job.clone();
    let answer = contract.call("POST", "/v1/job/cache/plan", &plan);
    contract.check("job_plan", &answer);

    // Dispatch: Nomad's sample payload to a parameterized job that takes its meta key.
    let parameterized = json!({"Job": {
        "ID": "param", "Type": "batch",
        "ParameterizedJob": {"Payload": "optional", "MetaOptional": ["key"]},
        "TaskGroups": [{"Name": "g", "Tasks": [{"Name": "t", "Driver": "mock",
            "Config": {"run_for": "0s"}, "DispatchPayload": {"File": "input"}}]}]}});
    contract.call("PUT", "/v1/jobs", &parameterized);
    let dispatch = fixture("job_dispatch");
    let answer = contract.call("POST", "/v1/job/param/dispatch", &dispatch["Request"]);
    contract.check("job_dispatch", &answer);

    // A CSI volume, created in Nomad's JSON through the reference plugin.
    agent.run_plugin("plugin", "hostpath", &[]).await;
    let volume = json!({"Volumes": [{
        "ID": "volume-id1", "Name": "volume id1", "PluginID": "hostpath",
        "RequestedCapabilities": [{"AccessMode": "single-node-writer", "AttachmentMode": "file-system"}]}]});
    contract.call("PUT", "/v1/volume/csi/volume-id1/create", &volume);
    let answer = contract.call("GET", "/v1/volume/csi/volume-id1", &Value::Null);
    contract.check("csi_volume_read", &answer);

    let fixtures = fixture_names();
    for name in &fixtures {
        assert!(
            contract.checked.contains(&name.as_str()),
            "fixture {name} is checked by nothing"
        );
    }
    for (name, fields, _) in ABSENT {
        assert!(
            fixtures.iter().any(|f| f == name),
            "ABSENT names fixture {name}, which does not exist"
        );
        assert!(!fields.is_empty());
    }
    assert!(
        contract.problems.is_empty(),
        "berth's answers differ from Nomad's documented shapes:\n{}",
        contract.problems.join("\n")
    );
}
