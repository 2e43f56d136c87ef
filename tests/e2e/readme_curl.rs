//! The `curl` examples the README quotes from Nomad's API docs, run as the README has
//! them against a production agent over TCP: read from the README's marked block, with
//! only the changes it names (the agent's address for the docs' `https://localhost:4646`
//! and `https://nomad.rocks`, the alloc id for the docs' sample id, the blocking query's
//! index for the README's `42`, and `X-Nomad-Token`).

use std::path::PathBuf;
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use base64::Engine as _;
use berth_harness::AgentProcess;
use serde_json::{Value, json};

use crate::nomad_api::http;

const MARKER: &str = "<!-- quoted-curl-examples";
const DOC_ALLOC_ID: &str = "5fc98185-17ff-26bc-a802-0c74fa471c99";

/// The README's quoted commands, each with its continuation lines.
fn quoted_commands() -> Vec<String> {
    let readme =
        std::fs::read_to_string(PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../README.md"))
            .unwrap();
    let block = readme
        .split_once(MARKER)
        .expect("the README marks its quoted curl examples")
        .1
        .split_once("```sh\n")
        .unwrap()
        .1
        .split_once("```")
        .unwrap()
        .0;
    let mut commands: Vec<String> = Vec::new();
    let mut continued = false;
    for line in block.lines() {
        match commands.last_mut() {
            Some(command) if continued => {
                command.push('\n');
                command.push_str(line);
            }
            _ => commands.push(line.to_string()),
        }
        continued = line.ends_with('\\');
    }
    commands
}

/// The command with the README's named changes.
fn localized(command: &str, port: u16, token: &str, alloc: &str, index: u64) -> String {
    let address = format!("http://127.0.0.1:{port}");
    let command = command
        .replace("https://localhost:4646", &address)
        .replace("https://nomad.rocks", &address)
        .replace(DOC_ALLOC_ID, alloc)
        .replace("index=42", &format!("index={index}"));
    let rest = command
        .strip_prefix("curl")
        .expect("each example is a curl command");
    format!("curl --header \"X-Nomad-Token: {token}\"{rest}")
}

fn run(command: &str, dir: &std::path::Path) -> Command {
    let mut shell = Command::new("bash");
    shell.arg("-c").arg(command).current_dir(dir);
    shell
}

fn stdout_json(output: &Output, command: &str) -> Value {
    assert!(output.status.success(), "{command}: {output:?}");
    serde_json::from_slice(&output.stdout).unwrap_or_else(|e| {
        panic!(
            "{command}: not JSON ({e}): {}",
            String::from_utf8_lossy(&output.stdout)
        )
    })
}

#[tokio::test(flavor = "multi_thread")]
async fn the_readmes_curl_examples_work_as_quoted() {
    let mut agent = AgentProcess::production(|port, dir| {
        format!(
            "http {{\n  address = \"127.0.0.1:{port}\"\n  token_file = \"{}/api-token\"\n}}\n",
            dir.display()
        )
    });
    agent.start().await;
    let token = std::fs::read_to_string(agent.path().join("api-token"))
        .unwrap()
        .trim()
        .to_string();
    let port = agent.port();
    let commands = quoted_commands();
    assert_eq!(commands.len(), 4, "{commands:#?}");

    // payload.json: the docs' Create Job sample, its task run by exec (berth has no
    // docker) and saying something for its logs.
    let work = tempfile::tempdir().unwrap();
    let mut payload = serde_json::from_str::<Value>(
        &std::fs::read_to_string(
            PathBuf::from(env!("CARGO_MANIFEST_DIR"))
                .join("../tests/fixtures/nomad/job_register_request.json"),
        )
        .unwrap(),
    )
    .unwrap()["Request"]
        .clone();
    let task = &mut payload["Job"]["TaskGroups"][0]["Tasks"][0];
    task["Driver"] = json!("exec");
    task["Config"] =
        json!({"command": "/bin/sh", "args": ["-c", "echo ready to serve; exec sleep 3600"]});
    std::fs::write(work.path().join("payload.json"), payload.to_string()).unwrap();

    // 1. Register the job from the payload file.
    let register = localized(&commands[0], port, &token, "", 0);
    let registered = stdout_json(&run(&register, work.path()).output().unwrap(), &register);
    assert!(
        registered["JobModifyIndex"].as_u64().is_some(),
        "{registered}"
    );
    let deadline = Instant::now() + Duration::from_secs(30);
    let alloc = loop {
        let (_, _, body) = http(port, "GET", "/v1/job/cache/allocations", &token, "");
        let allocs: Value = serde_json::from_str(&body).unwrap();
        let running = allocs.as_array().and_then(|a| {
            a.iter()
                .find(|a| a["TaskStates"]["redis"]["State"] == "running")
        });
        if let Some(alloc) = running {
            break alloc["ID"].as_str().unwrap().to_string();
        }
        assert!(
            Instant::now() < deadline,
            "the job never ran: {body}\n{}",
            agent.output()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    };

    // 2. The blocking query waits for a change past the index it was given. Taken once
    // the cluster is quiet: the node reports its tasks' states a moment after the alloc
    // runs here, and that is a change.
    let index_now = || {
        let (_, headers, _) = http(port, "GET", "/v1/allocations", &token, "");
        headers
            .iter()
            .find(|(k, _)| k == "x-nomad-index")
            .unwrap()
            .1
            .parse::<u64>()
            .unwrap()
    };
    let mut index = index_now();
    loop {
        tokio::time::sleep(Duration::from_millis(700)).await;
        let again = index_now();
        if again == index {
            break;
        }
        assert!(Instant::now() < deadline, "the index kept moving");
        index = again;
    }
    let list = localized(&commands[1], port, &token, &alloc, index);
    let mut waiting = run(&list, work.path())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(
        waiting.try_wait().unwrap().is_none(),
        "the blocking query answered with nothing changed"
    );
    let second = json!({"Job": {"ID": "second", "Type": "batch", "TaskGroups": [{"Name": "g",
        "Tasks": [{"Name": "t", "Driver": "mock", "Config": {"run_for": "0s"}}]}]}});
    let (status, _, body) = http(port, "PUT", "/v1/jobs", &token, &second.to_string());
    assert_eq!(status, 200, "{body}");
    let listed = stdout_json(&waiting.wait_with_output().unwrap(), &list);
    let jobs: Vec<&str> = listed
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|a| a["JobID"].as_str())
        .collect();
    // It answered at the change (the register): its allocs then, the second job's
    // placed moments after by the scheduler (Nomad's index is per table; berth's is the
    // store's, so the register itself is the change).
    assert!(jobs.contains(&"cache"), "{listed:#}");
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let (_, _, body) = http(port, "GET", "/v1/allocations", &token, "");
        if body.contains("\"JobID\":\"second\"") {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the second job was never placed: {body}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }

    // 3. The task's logs, one frame of base64 as Nomad's.
    let logs = localized(&commands[2], port, &token, &alloc, 0);
    let frame = stdout_json(&run(&logs, work.path()).output().unwrap(), &logs);
    let data = base64::engine::general_purpose::STANDARD
        .decode(frame["Data"].as_str().unwrap())
        .unwrap();
    assert_eq!(
        String::from_utf8_lossy(&data),
        "ready to serve\n",
        "{frame}"
    );

    // 4. The alloc dir.
    let ls = localized(&commands[3], port, &token, &alloc, 0);
    let files = stdout_json(&run(&ls, work.path()).output().unwrap(), &ls);
    let names: Vec<&str> = files
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|f| f["Name"].as_str())
        .collect();
    assert!(
        names.contains(&"alloc") && names.contains(&"redis"),
        "{files:#}"
    );
}
