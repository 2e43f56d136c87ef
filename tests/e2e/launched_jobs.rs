//! Jobs that launch jobs, as in Nomad: a parameterized job dispatched with a payload and
//! meta (`berth job dispatch`), and a periodic job launched on its cron schedule (and by
//! `berth job periodic force`), never two at once with `prohibit_overlap`, across an
//! agent restart.

use std::time::{Duration, Instant};

use berth_client::agent::JobStatus;
use berth_harness::AgentProcess;
use berth_model::status::ClientStatus;

const RENDER: &str = r#"
job "render" {
  type = "batch"

  parameterized {
    payload       = "required"
    meta_required = ["format"]
    meta_optional = ["pages"]
  }

  group "render" {
    restart {
      attempts = 0
    }
    task "render" {
      driver = "exec"
      dispatch_payload {
        file = "input/doc.md"
      }
      meta {
        pages = "all"
      }
      config {
        command = "sh"
        args    = ["-c", "wc -c < ${NOMAD_TASK_DIR}/input/doc.md; echo $NOMAD_META_format $NOMAD_META_pages $NOMAD_JOB_PARENT_ID"]
      }
    }
  }
}
"#;

const TICK: &str = r#"
job "tick" {
  type = "batch"

  periodic {
    crons            = ["* * * * * * *"]
    prohibit_overlap = true
  }

  group "g" {
    restart {
      attempts = 0
    }
    task "t" {
      driver = "exec"
      config {
        command = "sleep"
        args    = ["1.5"]
      }
    }
  }
}
"#;

fn alloc_of(stdout: &str) -> String {
    stdout
        .lines()
        .find_map(|l| l.trim().strip_prefix("alloc "))
        .unwrap_or_else(|| panic!("no alloc in {stdout}"))
        .to_string()
}

fn finished(status: &berth_client::alloc_runner::AllocStatus) -> bool {
    matches!(
        status.client_status,
        ClientStatus::Complete | ClientStatus::Failed
    )
}

#[tokio::test(flavor = "multi_thread")]
async fn a_parameterized_job_is_dispatched_with_its_payload_and_meta() {
    let mut agent = AgentProcess::new();
    agent.start().await;
    let jobspec = agent.path().join("render.nomad.hcl");
    std::fs::write(&jobspec, RENDER).unwrap();
    let (code, stdout, stderr) = agent.cli(&["job", "run", jobspec.to_str().unwrap()]);
    assert_eq!(code, 0, "{stdout}{stderr}");
    let (_, shown, _) = agent.cli(&["job", "status", "render"]);
    assert!(
        shown.contains("Status    = running") && shown.contains("parameterized = true"),
        "{shown}"
    );
    let payload = agent.path().join("doc.md");
    std::fs::write(&payload, "# hello payload\n").unwrap();
    let payload = payload.to_str().unwrap();

    let (code, stdout, stderr) =
        agent.cli(&["job", "dispatch", "-meta", "format=pdf", "render", payload]);
    assert_eq!(code, 0, "{stdout}{stderr}");
    let child = stdout
        .lines()
        .find_map(|l| l.strip_prefix("Dispatched Job ID = "))
        .unwrap_or_else(|| panic!("{stdout}"))
        .to_string();
    assert!(child.starts_with("render/dispatch-"), "{child}");
    let alloc = alloc_of(&stdout);
    agent.wait_alloc(&alloc, "finished", finished).await;
    let status = agent.alloc(&alloc).await;
    let output = std::fs::read_to_string(status.alloc_dir.join("alloc/logs/render.stdout.0"))
        .unwrap_or_default();
    assert_eq!(status.client_status, ClientStatus::Complete, "{output}");
    assert_eq!(output, "16\npdf all render\n");
    // The child is a job of its own, found by its id with the slash in it.
    let (code, shown, _) = agent.cli(&["job", "status", &child]);
    assert_eq!(code, 0, "{shown}");
    assert!(shown.contains("Parent    = render"), "{shown}");

    // What the parameterized block does not allow is refused, saying what it wants.
    let refused = |args: &[&str], why: &str| {
        let (code, stdout, stderr) = agent.cli(args);
        assert_eq!(code, 2, "{args:?}: {stdout}{stderr}");
        assert!(stderr.contains(why), "{args:?}: {stderr}");
    };
    refused(
        &["job", "dispatch", "-meta", "format=pdf", "render"],
        "job \"render\" requires a payload",
    );
    refused(
        &["job", "dispatch", "render", payload],
        "job \"render\" requires meta format (give it with -meta KEY=VALUE)",
    );
    refused(
        &[
            "job",
            "dispatch",
            "-meta",
            "format=pdf",
            "-meta",
            "color=red",
            "render",
            payload,
        ],
        "job \"render\" does not take meta color (its parameterized block allows: format, pages)",
    );
    let big = agent.path().join("big");
    std::fs::write(&big, vec![b'x'; 16 * 1024 + 1]).unwrap();
    refused(
        &[
            "job",
            "dispatch",
            "-meta",
            "format=pdf",
            "render",
            big.to_str().unwrap(),
        ],
        "the payload is 16385 bytes; a dispatch payload is at most 16384 bytes",
    );
    refused(
        &["job", "dispatch", "-meta", "format=pdf", "nope", payload],
        "no job matches \"nope\"",
    );
    let long_meta = format!("format={}", "x".repeat(16 * 1024));
    refused(
        &["job", "dispatch", "-meta", &long_meta, "render", payload],
        "the dispatch's meta is 16390 bytes; it is at most 16384 bytes",
    );
    refused(
        &["job", "dispatch", &child, payload],
        "is not parameterized",
    );
    refused(
        &["job", "periodic", "force", "render"],
        "job \"render\" is not periodic",
    );

    // A restarted agent rebuilds the child from its record: its parent, its payload.
    agent.kill9();
    agent.start().await;
    let job: JobStatus = agent
        .client()
        .get(&format!("/v1/berth/job/{}", child.replace('/', "%2F")))
        .await
        .unwrap();
    assert_eq!(job.parent.as_deref(), Some("render"));
    assert_eq!(job.allocs.len(), 1);
}

/// The allocs of `tick`'s children: (child job, alloc status).
async fn children(agent: &AgentProcess) -> Vec<(String, ClientStatus)> {
    let jobs: Vec<JobStatus> = agent
        .client()
        .get("/v1/berth/jobs?prefix=tick%2Fperiodic-")
        .await
        .unwrap();
    jobs.into_iter()
        .flat_map(|job| {
            job.allocs
                .into_iter()
                .map(move |a| (job.id.clone(), a.client_status))
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread")]
async fn a_periodic_job_launches_on_its_schedule_never_overlapping_and_after_a_restart() {
    let mut agent = AgentProcess::new();
    agent.start().await;
    let jobspec = agent.path().join("tick.nomad.hcl");
    std::fs::write(&jobspec, TICK).unwrap();
    let (code, stdout, stderr) = agent.cli(&["job", "run", jobspec.to_str().unwrap()]);
    assert_eq!(code, 0, "{stdout}{stderr}");

    // Every second a launch is due; each child runs 1.5 s, so without prohibit_overlap
    // two would run at once. Sampled for 5 s: never more than one.
    let until = Instant::now() + Duration::from_secs(5);
    let mut most_at_once = 0;
    while Instant::now() < until {
        let running = children(&agent)
            .await
            .iter()
            .filter(|(_, s)| matches!(s, ClientStatus::Pending | ClientStatus::Running))
            .count();
        most_at_once = most_at_once.max(running);
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let launched = children(&agent).await;
    assert_eq!(most_at_once, 1, "{launched:?}");
    assert!(
        (2..=4).contains(&launched.len()),
        "a launch each time the last one is done: {launched:?}"
    );
    assert!(
        launched
            .iter()
            .all(|(id, _)| id.starts_with("tick/periodic-")),
        "{launched:?}"
    );

    // A restarted agent keeps launching.
    let before_restart = children(&agent).await.len();
    agent.kill9();
    agent.start().await;
    let deadline = Instant::now() + Duration::from_secs(10);
    while children(&agent).await.len() <= before_restart {
        assert!(
            Instant::now() < deadline,
            "no launch after the restart\n{}",
            agent.output()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }

    // Stopped: no more launches, and no forced one.
    assert_eq!(agent.cli(&["job", "stop", "tick"]).0, 0);
    let stopped_with = children(&agent).await.len();
    tokio::time::sleep(Duration::from_millis(2500)).await;
    assert_eq!(children(&agent).await.len(), stopped_with);
    let (code, _, stderr) = agent.cli(&["job", "periodic", "force", "tick"]);
    assert_eq!(code, 2);
    assert!(stderr.contains("job \"tick\" is stopped"), "{stderr}");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_forced_periodic_launch_runs_now_whatever_the_schedule() {
    let mut agent = AgentProcess::new();
    agent.start().await;
    let jobspec = agent.path().join("yearly.nomad.hcl");
    std::fs::write(
        &jobspec,
        TICK.replace("\"* * * * * * *\"", "\"0 0 1 1 *\"")
            .replace("job \"tick\"", "job \"yearly\""),
    )
    .unwrap();
    assert_eq!(agent.cli(&["job", "run", jobspec.to_str().unwrap()]).0, 0);
    let (code, stdout, stderr) = agent.cli(&["job", "periodic", "force", "yearly"]);
    assert_eq!(code, 0, "{stdout}{stderr}");
    assert!(
        stdout.contains("Launched Job ID = yearly/periodic-"),
        "{stdout}"
    );
    let alloc = alloc_of(&stdout);
    agent.wait_alloc(&alloc, "finished", finished).await;
    assert_eq!(
        agent.alloc(&alloc).await.client_status,
        ClientStatus::Complete
    );
}

/// A lone agent that was down when a launch was due makes it once it is back (within a
/// minute), once, named by its scheduled time: the cluster's rule
/// (`cluster::scheduler::periodic::due`), where a lone agent used to skip it.
#[tokio::test(flavor = "multi_thread")]
async fn a_launch_missed_while_the_agent_was_down_is_made_once_it_is_back() {
    let mut agent = AgentProcess::new();
    agent.start().await;
    let due = run_once_a_minute(&agent, "minutely", 6, "1.5");
    agent.kill9();
    // Down across the launch time.
    while unix_now() < due + 2 {
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    agent.start().await;
    let deadline = Instant::now() + Duration::from_secs(10);
    while launched(&agent, "minutely").await.is_empty() {
        assert!(
            Instant::now() < deadline,
            "the missed launch was not made\n{}",
            agent.output()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(
        launched(&agent, "minutely").await,
        [format!("minutely/periodic-{due}")]
    );
}

/// The children `job` launched that are still recorded.
async fn launched(agent: &AgentProcess, job: &str) -> Vec<String> {
    let jobs: Vec<JobStatus> = agent
        .client()
        .get(&format!("/v1/berth/jobs?prefix={job}%2Fperiodic-"))
        .await
        .unwrap();
    jobs.into_iter().map(|job| job.id).collect()
}

/// Seconds since the epoch.
fn unix_now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs()
}

/// Runs `TICK` as `name`, launched once a minute at the second `in_secs` from now, its
/// task sleeping `sleep`; returns that launch's time (unix seconds).
fn run_once_a_minute(agent: &AgentProcess, name: &str, in_secs: u64, sleep: &str) -> u64 {
    let due = unix_now() + in_secs;
    let jobspec = agent.path().join(format!("{name}.nomad.hcl"));
    let source = TICK
        .replace(
            "\"* * * * * * *\"",
            &format!("\"{} * * * * * *\"", due % 60),
        )
        .replace("job \"tick\"", &format!("job \"{name}\""))
        .replace("args    = [\"1.5\"]", &format!("args    = [\"{sleep}\"]"));
    std::fs::write(&jobspec, source).unwrap();
    let (code, stdout, stderr) = agent.cli(&["job", "run", jobspec.to_str().unwrap()]);
    assert_eq!(code, 0, "{stdout}{stderr}");
    due
}

/// A launch is made once, however soon its child is collected: the last launch is kept
/// in the periodic job's own record, not read back from children the collector forgets
/// (an attack review saw one minute's launch made 31 times with `gc { interval = "2s"
/// max_allocs = 0 }`).
#[tokio::test(flavor = "multi_thread")]
async fn a_launch_is_made_once_however_soon_its_child_is_collected() {
    let mut agent = AgentProcess::with_config("gc {\n  interval = \"1s\"\n  max_allocs = 0\n}\n");
    agent.start().await;
    run_once_a_minute(&agent, "quick", 3, "0");
    // The launch, its child's end and several collections.
    tokio::time::sleep(Duration::from_secs(12)).await;
    let output = agent.output();
    let launches = output
        .lines()
        .filter(|l| l.contains("launched a child job") && l.contains("quick/periodic-"))
        .count();
    assert_eq!(launches, 1, "{output}");
    // Its child was collected (its job forgotten), which is what made it due again.
    let children = launched(&agent, "quick").await;
    assert!(
        children.is_empty(),
        "its child was never collected: {children:?}"
    );
}
