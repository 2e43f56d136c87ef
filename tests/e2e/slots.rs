//! What one job can take from everyone else (issue 34): WebAssembly instance slots held
//! by running tasks, the `mock` development driver being off unless the operator enables
//! it, and a purge racing a resubmit of the same job.

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use berth_client::agent::{AllocSummary, JobStatus};
use berth_harness::AgentProcess;
use berth_model::status::{ClientStatus, DesiredStatus};

/// A service job of `count` mock tasks that run for 100 hours, each alloc's disk 10 MB (300
/// allocs of Nomad's default 300 MB would ask this node for 90 GB of images), CPU and
/// memory small enough for 300 to fit the node's capacity.
fn long_mock_job(name: &str, count: u32) -> String {
    format!(
        "job \"{name}\" {{\n  group \"g\" {{\n    count = {count}\n    ephemeral_disk {{ size = 10 }}\n    task \"t\" {{\n      \
         driver = \"mock\"\n      logs {{\n        max_files = 1\n        max_file_size = 1\n      }}\n      \
         config {{ run_for = \"100h\" }}\n      resources {{\n        cpu    = 10\n        memory = 32\n      }}\n    }}\n  }}\n}}\n"
    )
}

async fn allocs(agent: &AgentProcess) -> Vec<AllocSummary> {
    agent.client().get("/v1/berth/allocations").await.unwrap()
}

async fn jobs(agent: &AgentProcess) -> Vec<JobStatus> {
    agent.client().get("/v1/berth/jobs").await.unwrap()
}

/// The job an alloc's name (`job.group[index]`) says it belongs to.
fn job_of(alloc: &AllocSummary) -> &str {
    alloc.name.split('.').next().unwrap_or_default()
}

/// 300 running mock tasks, more than the 256 instance slots, hold none: the host waits
/// for their end itself. They all run, and the operator still submits another job (its
/// check needs a slot) in under a second. On a build where a running mock task holds a
/// slot, 44 of the 300 wait 30 s for one and fail, and so does the operator's submit.
#[tokio::test(flavor = "multi_thread")]
async fn three_hundred_long_mock_tasks_leave_the_operator_room_to_submit() {
    let mut agent = AgentProcess::new();
    agent.start().await;
    let submitted = agent
        .submit("long.hcl", &long_mock_job("long", 300))
        .await
        .unwrap();
    assert_eq!(submitted.alloc_ids.len(), 300);
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        let all = allocs(&agent).await;
        let running = all
            .iter()
            .filter(|a| a.client_status == ClientStatus::Running)
            .count();
        let failed: Vec<&AllocSummary> = all
            .iter()
            .filter(|a| a.client_status == ClientStatus::Failed)
            .collect();
        assert!(failed.is_empty(), "allocs failed: {failed:?}");
        if running == 300 {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "{running} of 300 mock tasks run after 2 minutes\n{}",
            agent.output()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }

    let started = Instant::now();
    let after = agent
        .submit(
            "after.hcl",
            "job \"after\" {\n  type = \"batch\"\n  group \"g\" {\n    task \"t\" {\n      \
             driver = \"mock\"\n      config { run_for = \"0s\" }\n    }\n  }\n}\n",
        )
        .await;
    let took = started.elapsed();
    eprintln!("the operator's submit took {took:?} beside 300 running mock tasks");
    let after =
        after.unwrap_or_else(|e| panic!("the operator's submit failed after {took:?}: {e}"));
    assert!(
        took < Duration::from_secs(1),
        "the operator's submit took {took:?}"
    );
    let finished = agent.finished(&after.alloc_ids[0]).await;
    assert_eq!(finished.client_status, ClientStatus::Complete);
}

/// Without `plugin "mock" { config { enabled = true } }`, a job naming `mock` is refused
/// by name, at submit and by `berth job validate`, and says how the operator enables it.
#[tokio::test(flavor = "multi_thread")]
async fn mock_is_refused_by_name_unless_the_operator_enables_it() {
    let mut agent = AgentProcess::new();
    // The harness enables mock for every other test: this agent's config does not.
    std::fs::write(agent.path().join("agent.hcl"), "").unwrap();
    agent.start().await;
    let refusal = "task \"t\": driver \"mock\" is disabled on this agent: it is a development \
                   driver, whose tasks only pretend to run; an operator enables it with plugin \
                   \"mock\" { config { enabled = true } } in the agent config";
    let error = agent
        .submit("one.hcl", &long_mock_job("one", 1))
        .await
        .unwrap_err();
    let berth_api::client::ClientError::Api(answer, _) = &error else {
        panic!("not the agent's refusal: {error}");
    };
    assert!(
        answer.problems.iter().any(|p| p.contains(refusal)),
        "{answer:?}"
    );
    assert!(allocs(&agent).await.is_empty());

    let job = agent.path().join("one.hcl");
    std::fs::write(&job, long_mock_job("one", 1)).unwrap();
    let (code, stdout, stderr) = agent.cli(&["job", "validate", job.to_str().unwrap()]);
    assert_eq!(code, 2, "{stdout}{stderr}");
    assert!(stderr.contains(refusal), "{stderr}");

    // Enabled, the same job runs.
    agent.terminate(Duration::from_secs(30));
    std::fs::write(
        agent.path().join("agent.hcl"),
        "plugin \"mock\" {\n  config {\n    enabled = true\n  }\n}\n",
    )
    .unwrap();
    agent.start().await;
    let submitted = agent
        .submit("one.hcl", &long_mock_job("one", 1))
        .await
        .unwrap();
    agent
        .wait_alloc(&submitted.alloc_ids[0], "running", |s| {
            s.client_status == ClientStatus::Running
        })
        .await;
}

/// Rounds of the race below.
const PURGE_ROUNDS: usize = 50;

/// A purge (`DELETE /v1/job/lk?purge=true`) racing a resubmit of the same job, 50 times.
/// Whichever comes first, what is left is consistent: every alloc that runs belongs to a
/// job the agent lists, and after a restart the agent finds no alloc of an unrecorded
/// job. Without one lock for a job's purge and its submit, a purge that had found the
/// job without allocs removed its record just after the resubmit placed new ones: they
/// ran on with desired status `run` under no job, and after a restart the log said
/// "not recorded; left alone". (The race also found a stop sent to an alloc whose tasks
/// did not listen yet being lost: the alloc ran on with desired status `stop`.)
#[tokio::test(flavor = "multi_thread")]
async fn a_purge_racing_a_resubmit_leaves_no_alloc_behind() {
    let mut agent = AgentProcess::new();
    agent.start().await;
    // A short shutdown delay: the purge and the resubmit both wait for the same allocs
    // to stop, and go on at the same moment.
    let job = "job \"lk\" {\n  group \"g\" {\n    count = 3\n    task \"t\" {\n      \
               driver = \"mock\"\n      shutdown_delay = \"50ms\"\n      \
               config { run_for = \"100h\" }\n    }\n  }\n}\n";
    let client = agent.client();
    for round in 0..PURGE_ROUNDS {
        if !jobs(&agent).await.iter().any(|j| j.id == "lk") {
            agent.submit("lk.hcl", job).await.unwrap();
        }
        let purge = async {
            let _: serde_json::Value = client.delete("/v1/job/lk?purge=true").await.unwrap();
        };
        let resubmit = async {
            // Spread over the purge's steps: before its stop, during its wait, after.
            tokio::time::sleep(Duration::from_millis((round % 10) as u64 * 15)).await;
            agent.submit("lk.hcl", job).await
        };
        let ((), resubmitted) = tokio::join!(purge, resubmit);
        resubmitted.unwrap_or_else(|e| panic!("round {round}: the resubmit failed: {e}"));
        // Either came last: the job runs (the resubmit), or it is gone with its allocs
        // (the purge). The purge may still go on in the background: wait for either.
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let listed: BTreeSet<String> = jobs(&agent).await.into_iter().map(|j| j.id).collect();
            let all = allocs(&agent).await;
            let orphans: Vec<&AllocSummary> =
                all.iter().filter(|a| !listed.contains(job_of(a))).collect();
            let running = all
                .iter()
                .filter(|a| a.client_status == ClientStatus::Running)
                .count();
            let settled = if listed.contains("lk") {
                running == 3
            } else {
                running == 0
            };
            if orphans.is_empty() && settled {
                break;
            }
            assert!(
                Instant::now() < deadline,
                "round {round}: {running} allocs run; these belong to no listed job \
                 ({} with desired status run): {orphans:#?}\njobs: {listed:?}\nall: {all:#?}\n{}",
                orphans
                    .iter()
                    .filter(|a| a.desired_status == DesiredStatus::Run)
                    .count(),
                agent.output()
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
    agent.terminate(Duration::from_secs(60));
    agent.start().await;
    let log = agent.output();
    assert!(!log.contains("not recorded"), "{log}");
    let listed: BTreeSet<String> = jobs(&agent).await.into_iter().map(|j| j.id).collect();
    let after = allocs(&agent).await;
    assert!(
        after.iter().all(|a| listed.contains(job_of(a))),
        "allocs of no listed job after a restart: {after:#?}\njobs: {listed:?}"
    );
}

/// A resubmit replaces its job's old allocs without waiting for a stubborn one to stop
/// (its kill timeout runs on the node), and other jobs' submissions do not wait for it
/// (attack review: a resubmit once held every submission for its old task's 8 s). The
/// new version's static ports are its own: a job that wants one meanwhile is accepted and
/// waits, its evaluation naming the port (second review: such a job once took the port).
#[tokio::test(flavor = "multi_thread")]
async fn a_resubmit_of_a_stubborn_task_holds_up_no_other_job_nor_loses_its_port() {
    let mut agent = AgentProcess::new();
    agent.start().await;
    let stubborn = |version: u32| {
        format!(
            "job \"stubborn\" {{\n  meta {{\n    version = \"{version}\"\n  }}\n  group \"g\" {{\n    \
             network {{\n      port \"http\" {{\n        static = 28787\n      }}\n    }}\n    \
             task \"t\" {{\n      driver = \"exec\"\n      kill_timeout = \"8s\"\n      config {{\n        \
             command = \"/bin/sh\"\n        args = [\"-c\", \"trap '' TERM; echo up; while :; do sleep 1; done\"]\n      \
             }}\n    }}\n  }}\n}}\n"
        )
    };
    let first = agent.submit("stubborn.hcl", &stubborn(1)).await.unwrap();
    // Its shell says "up" once the trap is set: only then is it asked to stop.
    agent
        .wait_alloc(&first.alloc_ids[0], "running with its trap set", |s| {
            std::fs::read_to_string(s.alloc_dir.join("alloc/logs/t.stdout.0"))
                .is_ok_and(|out| out.contains("up"))
        })
        .await;
    let started = Instant::now();
    let resubmitted = agent.submit("stubborn.hcl", &stubborn(2)).await.unwrap();
    let resubmit_took = started.elapsed();
    assert_eq!(resubmitted.replaced, first.alloc_ids, "{resubmitted:?}");
    assert_eq!(resubmitted.alloc_ids.len(), 1, "{resubmitted:?}");
    let started = Instant::now();
    agent
        .submit("other.hcl", &long_mock_job("other", 1))
        .await
        .unwrap();
    let other_took = started.elapsed();
    // A job wanting the port the new version holds: accepted, not given the port.
    let source = "job \"thief\" {\n  group \"g\" {\n    network {\n      port \"http\" {\n        static = 28787\n      }\n    }\n    task \"t\" {\n      driver = \"mock\"\n    }\n  }\n}\n";
    let thief = agent.submit("thief.hcl", source).await.unwrap();
    assert!(
        thief.alloc_ids.is_empty(),
        "the thief was given the port: {thief:?}"
    );
    let evaluation: serde_json::Value = agent
        .client()
        .get(&format!("/v1/evaluation/{}", thief.eval_id))
        .await
        .unwrap();
    assert_eq!(
        evaluation["FailedTGAllocs"]["g"]["DimensionExhausted"]["network: reserved port collision 28787"],
        1,
        "{evaluation:#}"
    );
    assert!(
        resubmit_took < Duration::from_secs(5),
        "the resubmit waited for the old task: {resubmit_took:?}"
    );
    assert!(
        other_took < Duration::from_secs(2),
        "another job's submit took {other_took:?}"
    );
    // The old task still gets its kill timeout, and then ends.
    agent.finished(&first.alloc_ids[0]).await;
}
