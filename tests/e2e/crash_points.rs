//! The agent killed (-9) at a random moment of a big job's submission and start: when it
//! is back, the job is there with every one of its allocs or not at all, as many task
//! processes run as the job has tasks (none left over from the killed agent next to
//! their restarted copies), and none is left once the job stops.
//!
//! A submit is answered within milliseconds, so kills at random moments of a few hundred
//! would nearly all land after it: every other round aims its kill within the shortest
//! submit seen answered so far, and the test asserts that at least one kill interrupted a submit
//! in flight (the request sent, the answer never received), with extra aimed rounds
//! (at most ten) until one has.
//!
//! `BERTH_CRASH_COUNT` (default 100) and `BERTH_CRASH_ROUNDS` (default 5) size it; the
//! issue's figure, 200 tasks 20 times, is `BERTH_CRASH_COUNT=200 BERTH_CRASH_ROUNDS=20`.

use std::time::{Duration, Instant};

use berth_api::SubmitRequest;
use berth_api::client::ClientError;
use berth_client::agent::{JobStatus, Submitted};
use berth_harness::AgentProcess;
use berth_model::status::ClientStatus;

fn setting(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// Processes running `sleep <mark>`: the job's tasks, wherever they come from.
fn sleepers(mark: &str) -> usize {
    std::fs::read_dir("/proc")
        .unwrap()
        .flatten()
        .filter(|e| {
            e.file_name()
                .to_str()
                .is_some_and(|n| n.parse::<u32>().is_ok())
        })
        .filter(|e| {
            std::fs::read(e.path().join("cmdline")).is_ok_and(|cmdline| {
                let args: Vec<&[u8]> = cmdline.split(|b| *b == 0).collect();
                matches!(args.as_slice(), [program, arg, b""]
                    if program.ends_with(b"sleep") && *arg == mark.as_bytes())
            })
        })
        .count()
}

async fn wait_for(what: &str, agent: &AgentProcess, mut done: impl AsyncFnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(60);
    while !done().await {
        assert!(
            Instant::now() < deadline,
            "never {what}\n{}",
            agent.output()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn a_kill_9_at_any_moment_of_a_big_submit_loses_and_doubles_no_task() {
    let count = setting("BERTH_CRASH_COUNT", 100);
    let rounds = setting("BERTH_CRASH_ROUNDS", 5);
    let mut agent = AgentProcess::new();
    agent.start().await;
    // A small generator, seeded from the clock: each run kills at other moments; the
    // moments are printed so that a failing one can be told apart.
    let mut seed = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos() as u64;
    let mut next = move || {
        seed = seed
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        seed >> 33
    };
    let mut outcomes = Vec::new();
    // The shortest submit answered before its kill: an aimed kill lands within it, so
    // that it comes after the request was sent and before the answer.
    let mut submit_window: Option<Duration> = None;
    let mut interrupted = 0;
    for round in 0.. {
        if round >= rounds && (interrupted > 0 || round >= rounds + 10) {
            break;
        }
        let job = format!("crowd{round}");
        let mark = format!("7{round:03}");
        let source = format!(
            r#"job "{job}" {{
  group "g" {{
    count = {count}
    ephemeral_disk {{
      size = 10
    }}
    task "t" {{
      driver = "exec"
      logs {{
        max_files     = 1
        max_file_size = 1
      }}
      config {{
        command = "sleep"
        args    = ["{mark}"]
      }}
      # Small enough for all of them to fit the node's capacity.
      resources {{
        cpu    = 10
        memory = 32
      }}
    }}
  }}
}}"#
        );
        let client = agent.client();
        let request = SubmitRequest {
            source_name: format!("{job}.hcl"),
            source,
            variables: Default::default(),
        };
        let sent = Instant::now();
        let submit = tokio::spawn(async move {
            let answer = client
                .post::<_, Submitted>("/v1/berth/jobs", &request)
                .await;
            (answer, sent.elapsed())
        });
        let aimed = round % 2 == 1 || round >= rounds;
        let kill_after = match submit_window {
            Some(window) if aimed => {
                Duration::from_micros(next() % (window.as_micros() as u64).max(1))
            }
            _ => Duration::from_millis(next() % 300),
        };
        tokio::time::sleep(kill_after).await;
        agent.kill9();
        let (answer, took) = submit.await.unwrap();
        // Answered: the kill came after. Refused: before the request was sent. Any other
        // failure to reach the agent: the request was sent and never answered.
        let submit_outcome = match &answer {
            Ok(_) => {
                submit_window = Some(submit_window.map_or(took, |w| w.min(took)));
                "answered"
            }
            Err(ClientError::Unreachable { reason, .. })
                if reason.contains("Connection refused") =>
            {
                "never sent"
            }
            Err(ClientError::Unreachable { .. }) => {
                interrupted += 1;
                "interrupted in flight"
            }
            Err(other) => panic!("round {round}: the submit failed otherwise: {other}"),
        };
        agent.start().await;

        let status: Result<JobStatus, ClientError> =
            agent.client().get(&format!("/v1/berth/job/{job}")).await;
        // A job recorded with its evaluation still pending is placed by the scheduler's
        // first round after the restart: its allocs appear then, all at once (one
        // transaction for up to 100).
        let status = match status {
            Ok(found) if found.allocs.is_empty() && !found.stopped => {
                let mut placed = found;
                let deadline = Instant::now() + Duration::from_secs(10);
                while placed.allocs.is_empty() && Instant::now() < deadline {
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    placed = agent
                        .client()
                        .get(&format!("/v1/berth/job/{job}"))
                        .await
                        .unwrap();
                }
                Ok(placed)
            }
            other => other,
        };
        let Ok(status) = status else {
            // Killed before the job was recorded: nothing of it may run.
            outcomes.push(format!("{kill_after:?}: {submit_outcome}, not recorded"));
            tokio::time::sleep(Duration::from_millis(500)).await;
            assert_eq!(
                sleepers(&mark),
                0,
                "round {round}: a task of an unrecorded job runs"
            );
            continue;
        };
        assert_eq!(
            status.allocs.len(),
            count,
            "round {round} (killed after {kill_after:?}): every alloc or none"
        );
        outcomes.push(format!(
            "{kill_after:?}: {submit_outcome}, {} allocs",
            status.allocs.len()
        ));
        wait_for("all running", &agent, async || {
            let status: JobStatus = agent
                .client()
                .get(&format!("/v1/berth/job/{job}"))
                .await
                .unwrap();
            status
                .allocs
                .iter()
                .all(|a| a.client_status == ClientStatus::Running)
        })
        .await;
        wait_for("one process per task", &agent, async || {
            sleepers(&mark) == count
        })
        .await;
        // And it stays so: nothing left from the killed agent next to a restarted copy.
        tokio::time::sleep(Duration::from_secs(1)).await;
        assert_eq!(
            sleepers(&mark),
            count,
            "round {round} (killed after {kill_after:?}): one process per running task"
        );

        assert_eq!(agent.cli(&["job", "stop", &job]).0, 0);
        wait_for("stopped", &agent, async || {
            let status: JobStatus = agent
                .client()
                .get(&format!("/v1/berth/job/{job}"))
                .await
                .unwrap();
            status.allocs.iter().all(|a| {
                matches!(
                    a.client_status,
                    ClientStatus::Complete | ClientStatus::Failed
                )
            })
        })
        .await;
        wait_for("no process left", &agent, async || sleepers(&mark) == 0).await;
    }
    eprintln!("crash points: {outcomes:?}");
    assert!(
        interrupted > 0,
        "no kill landed while a submit was in flight: {outcomes:?}"
    );
}
