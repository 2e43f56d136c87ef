//! The agent's metrics (`GET /v1/metrics`, go-metrics JSON and Prometheus text) and the
//! log messages a plugin dropped past its budget, counted per plugin and shown by
//! `berth driver list`, on a production agent in its own process.

use std::time::Duration;

use berth_harness::AgentProcess;
use serde_json::Value;

use crate::nomad_api::http;

const VIEWER: &str = "viewer-secret-0123456789";

/// A production agent with the misbehaving driver in its plugin dir, on TCP with a submit
/// token (returned) and a read token ([`VIEWER`]).
async fn agent_with_misbehave() -> (AgentProcess, tempfile::TempDir, String) {
    let plugins = tempfile::tempdir().unwrap();
    std::fs::copy(
        berth_builtin::test_components::MISBEHAVE,
        plugins.path().join("misbehave.wasm"),
    )
    .unwrap();
    let plugin_dir = plugins.path().to_path_buf();
    let mut agent = AgentProcess::production(|port, dir| {
        format!(
            "plugin_dir = \"{}\"\nhttp {{\n  address = \"127.0.0.1:{port}\"\n  token_file = \"{}/api-token\"\n  token \"viewer\" {{\n    secret = \"{VIEWER}\"\n    scope  = \"read\"\n  }}\n}}\n",
            plugin_dir.display(),
            dir.display()
        )
    });
    agent.start().await;
    let token = std::fs::read_to_string(agent.path().join("api-token"))
        .unwrap()
        .trim()
        .to_string();
    (agent, plugins, token)
}

/// The misbehave driver's row of `berth driver list`, split into its cells.
fn driver_row(agent: &AgentProcess) -> (Vec<String>, Vec<String>) {
    let (code, stdout, stderr) = agent.cli(&["driver", "list"]);
    assert_eq!(code, 0, "{stdout}{stderr}");
    let cells = |line: &str| line.split_whitespace().map(str::to_string).collect();
    let header = cells(stdout.lines().next().unwrap());
    let row = stdout
        .lines()
        .find(|l| l.starts_with("misbehave "))
        .unwrap_or_else(|| panic!("no misbehave row:\n{stdout}"));
    (header, cells(row))
}

fn dropped_cell(agent: &AgentProcess) -> String {
    let (header, row) = driver_row(agent);
    let column = header.iter().position(|h| h == "Logs-Dropped").unwrap();
    row[column].clone()
}

fn find<'a>(list: &'a Value, name: &str, label: (&str, &str)) -> Option<&'a Value> {
    list.as_array()?
        .iter()
        .find(|entry| entry["Name"] == name && entry["Labels"][label.0] == label.1)
}

/// A driver that logs 100,000 messages (with forged lines) in each call is cut at its
/// budget; what it dropped is counted per plugin and shown by `berth driver list`, by
/// `/v1/berth/agent/log-drops` and in `/v1/metrics` (JSON and Prometheus), and the agent's
/// log holds no more than the budget per call and no forged line.
#[tokio::test(flavor = "multi_thread")]
async fn a_driver_that_floods_the_log_is_counted_and_the_agent_log_stays_within_its_budget() {
    let (mut agent, _plugins, token) = agent_with_misbehave().await;
    assert_eq!(dropped_cell(&agent), "0");

    let job = r#"job "flood" {
  type = "batch"
  group "g" {
    task "t" {
      driver = "misbehave"
      config {
        behave = "flood-log"
      }
    }
  }
}
"#;
    // Validated at submit (one flood), then where it is placed and started (two more, if
    // it gets that far).
    let submitted = agent.submit("flood.hcl", job).await;
    if let Ok(submitted) = &submitted {
        for id in &submitted.alloc_ids {
            agent.finished(id).await;
        }
    }
    // The agent's log: the budget of each flooding call (validate at submit, validate
    // again on the node it is placed on, and start if it got that far), one line each,
    // no forged line.
    let budget = u64::from(berth_runtime::host_api::log::MAX_MESSAGES_PER_CALL);
    let log = agent.output();
    let logged = log.lines().filter(|l| l.contains("flood ")).count() as u64;
    assert!(
        logged > 0 && logged <= 3 * budget && logged.is_multiple_of(budget),
        "{logged} lines: {}",
        &log[..log.len().min(2000)]
    );
    assert!(!log.lines().any(|l| l.starts_with("FORGED")));

    let drops: berth_api::nomad::metrics::LogDrops = agent
        .client()
        .get("/v1/berth/agent/log-drops")
        .await
        .unwrap();
    let dropped = drops.plugins.get("misbehave").copied().unwrap_or(0);
    let calls = dropped / (100_000 - budget);
    assert!(
        calls == logged / budget && dropped == calls * (100_000 - budget),
        "{drops:?} ({submitted:?})"
    );
    assert_eq!(dropped_cell(&agent), dropped.to_string());

    // /v1/metrics, with the read token: Nomad's JSON.
    let (status, _, body) = http(agent.port(), "GET", "/v1/metrics", VIEWER, "");
    assert_eq!(status, 200, "{body}");
    let summary: Value = serde_json::from_str(&body).unwrap();
    let counter = find(
        &summary["Counters"],
        "berth.plugin.log_dropped",
        ("plugin", "misbehave"),
    )
    .unwrap_or_else(|| panic!("{summary:#}"));
    assert_eq!(counter["Sum"], dropped as f64, "{counter}");
    assert_eq!(counter["Count"], calls, "{counter}");
    let validate = summary["Samples"]
        .as_array()
        .unwrap()
        .iter()
        .find(|s| {
            s["Name"] == "berth.plugin.call"
                && s["Labels"]["plugin"] == "misbehave"
                && s["Labels"]["call"] == "validate-task-config"
                && s["Labels"]["kind"] == "driver"
        })
        .unwrap_or_else(|| panic!("{summary:#}"));
    assert!(validate["Count"].as_u64().unwrap() >= 1 && validate["Max"].as_f64().unwrap() > 0.0);
    let terminal = find(
        &summary["Gauges"],
        "nomad.client.allocations.terminal",
        ("datacenter", "dc1"),
    )
    .unwrap_or_else(|| panic!("{summary:#}"));
    let allocs = submitted.as_ref().map_or(0, |s| s.alloc_ids.len());
    assert_eq!(terminal["Value"], allocs as f64);
    assert!(
        summary["Timestamp"]
            .as_str()
            .unwrap()
            .ends_with(" +0000 UTC")
    );
    assert_eq!(summary["Points"], serde_json::json!([]));

    // The same registry as Prometheus text.
    let (status, headers, text) = http(
        agent.port(),
        "GET",
        "/v1/metrics?format=prometheus",
        VIEWER,
        "",
    );
    assert_eq!(status, 200, "{text}");
    assert!(
        headers
            .iter()
            .any(|(k, v)| k == "content-type" && v.starts_with("text/plain; version=0.0.4")),
        "{headers:?}"
    );
    assert!(
        text.contains(&format!(
            "berth_plugin_log_dropped{{plugin=\"misbehave\"}} {dropped}"
        )),
        "{text}"
    );
    assert!(text.contains("nomad_client_allocations_running{"), "{text}");

    // python-nomad reads the same JSON.
    let script = "import json, sys, nomad\n\
n = nomad.Nomad(host='127.0.0.1', port=int(sys.argv[1]), token=sys.argv[2], timeout=30)\n\
m = n.metrics.get_metrics()\n\
print(json.dumps(sorted(g['Name'] for g in m['Gauges'])))\n";
    let output = std::process::Command::new("python3")
        .args(["-c", script, &agent.port().to_string(), VIEWER])
        .output()
        .expect("python3 runs (with python-nomad==2.1.0, which .ci/test installs)");
    let gauges = String::from_utf8_lossy(&output.stdout);
    assert!(
        gauges.contains("\"nomad.client.allocations.running\"")
            && gauges.contains("\"berth.client.tasks.dead\""),
        "{gauges}{}",
        String::from_utf8_lossy(&output.stderr)
    );

    // The read token reads, and may not write (a CSI registration here).
    let (status, _, body) = http(
        agent.port(),
        "PUT",
        "/v1/volume/csi/v",
        VIEWER,
        r#"{"Volumes": [{"ID": "v"}]}"#,
    );
    assert_eq!(status, 403, "{body}");

    // Nomad's errors: an unknown format; a token the agent does not know.
    let (status, _, body) = http(agent.port(), "GET", "/v1/metrics?format=xml", &token, "");
    assert_eq!(
        (status, body.contains("unsupported metrics format")),
        (400, true),
        "{body}"
    );
    let (status, _, _) = http(agent.port(), "GET", "/v1/metrics", "not-a-token", "");
    assert_eq!(status, 403);

    // No agent answers: the count is "-", not a guess.
    agent.kill9();
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert_eq!(dropped_cell(&agent), "-");
}
