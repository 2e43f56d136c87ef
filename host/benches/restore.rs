//! An agent killed with `kill -9` while N exec tasks run, and started again: the time
//! until every task is recovered (its driver re-attached and its process supervised
//! again), next to the same agent's start on an empty node, measured in the same run
//! (empty starts before and after the restore; their median is the baseline). Also the
//! real agent's resident memory with all N running, before and after the restart.
//!
//! Runs the `berth` binary (`berth agent -dev` on a free port, its own data dir:
//! `berth_harness::AgentProcess`, as the end-to-end tests do).
//! `BERTH_RESTORE_TASKS` (1000) sets N. Run as root:
//! `cargo bench -p berth --bench restore`. It ends with `summary: name = value` lines.

mod common;

use std::time::{Duration, Instant};

use berth_api::SubmitRequest;
use berth_client::agent::{AllocSummary, Submitted};
use berth_harness::AgentProcess;
use berth_harness::cleanup::processes_rooted_under;
use berth_model::status::ClientStatus;
use common::{median, micros, summary};

fn main() {
    // The jobspec reader, as the `berth` binary installs it at its start.
    berth_jobspec_hcl::install();
    common::block_on(run());
}

/// How many times the agent's current run logged `what`.
fn logged(agent: &AgentProcess, what: &str) -> usize {
    agent.output().matches(what).count()
}

async fn running(agent: &AgentProcess) -> usize {
    let allocs: Vec<AllocSummary> = agent.client().get("/v1/berth/allocations").await.unwrap();
    allocs
        .iter()
        .filter(|a| a.client_status == ClientStatus::Running)
        .count()
}

/// Starts the agent; returns when its API answers, with the time that took.
async fn timed_start(agent: &mut AgentProcess) -> Duration {
    let started = Instant::now();
    agent.start().await;
    started.elapsed()
}

async fn run() {
    let tasks: usize = std::env::var("BERTH_RESTORE_TASKS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(common::sized(1000, 20));
    let mut empty_starts = Vec::new();
    let mut empty = AgentProcess::new();
    let empty_start = async |empty: &mut AgentProcess| {
        let took = timed_start(empty).await;
        empty.kill9();
        took
    };
    empty_starts.push(empty_start(&mut empty).await);
    empty_starts.push(empty_start(&mut empty).await);

    let mut agent = AgentProcess::new();
    agent.start().await;
    let job = format!(
        "job \"restore\" {{\n  group \"g\" {{\n    count = {tasks}\n    task \"t\" {{\n      driver = \"exec\"\n      config {{\n        command = \"/bin/sleep\"\n        args    = [\"3600\"]\n      }}\n    }}\n  }}\n}}\n"
    );
    let request = SubmitRequest {
        source_name: "restore.hcl".into(),
        source: job,
        variables: Default::default(),
    };
    let submitted: Submitted = agent
        .client()
        .post("/v1/berth/jobs", &request)
        .await
        .unwrap();
    assert_eq!(submitted.alloc_ids.len(), tasks);
    // An alloc is "running" as soon as its runner is; its task has started when the
    // log says so.
    wait_for(Duration::from_secs(600), "every task running", async || {
        logged(&agent, "kind=Started") >= tasks
    })
    .await;
    let rss_before = resident_mib(agent.pid());

    agent.kill9();
    let started = Instant::now();
    let api_up = timed_start(&mut agent).await;
    wait_for(
        Duration::from_secs(600),
        "every task recovered",
        async || logged(&agent, "recovered the task after an agent restart") >= tasks,
    )
    .await;
    let restored = started.elapsed();
    let still_running = running(&agent).await;
    let started_anew = logged(&agent, "kind=Started");
    let rss_after = resident_mib(agent.pid());

    empty_starts.push(empty_start(&mut empty).await);
    empty_starts.push(empty_start(&mut empty).await);
    let empty = median(empty_starts);

    let _: serde_json::Value = agent
        .client()
        .delete("/v1/berth/job/restore")
        .await
        .unwrap();
    wait_for(Duration::from_secs(600), "every task stopped", async || {
        running(&agent).await == 0
    })
    .await;
    let left = processes_rooted_under(agent.path()).len();
    agent.kill9();
    assert_eq!(still_running, tasks, "tasks lost in the restart");
    assert_eq!(started_anew, 0, "tasks started again instead of recovered");
    assert_eq!(left, 0, "processes left after the job stopped");

    println!("kill -9 and restart of an agent running {tasks} exec tasks (release build)");
    println!(
        "  API answers again after          {:>9.0} ms",
        api_up.as_secs_f64() * 1e3
    );
    println!(
        "  every task recovered after       {:>9.0} ms",
        restored.as_secs_f64() * 1e3
    );
    println!(
        "  an empty agent's start (median)  {:>9.0} ms",
        empty.as_secs_f64() * 1e3
    );
    println!("  agent RSS with all running: {rss_before} MiB before, {rss_after} MiB after");
    summary("restore_tasks", tasks as f64);
    summary("restore_all_recovered_ms", micros(restored) / 1e3);
    summary("restore_api_up_ms", micros(api_up) / 1e3);
    summary("empty_agent_start_ms", micros(empty) / 1e3);
    summary("restore_over_empty_start", common::ratio(restored, empty));
    summary("agent_rss_all_running_mib", rss_before as f64);
    summary("agent_rss_after_restore_mib", rss_after as f64);
}

async fn wait_for(limit: Duration, what: &str, mut done: impl AsyncFnMut() -> bool) {
    let started = Instant::now();
    while !done().await {
        assert!(started.elapsed() < limit, "never got to {what}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

fn resident_mib(pid: u32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap_or_default()
        .lines()
        .find_map(|line| line.strip_prefix("VmRSS:"))
        .and_then(|rest| rest.split_whitespace().next())
        .and_then(|kib| kib.parse::<u64>().ok())
        .unwrap_or(0)
        >> 10
}
