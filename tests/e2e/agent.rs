//! The agent as a person runs it: `berth agent` in its own process, driven through the
//! HTTP API and the CLI, killed with SIGKILL and restarted on the same data dir.

use std::process::Command;
use std::time::{Duration, Instant};

use berth_api::client::ClientError;
use berth_client::agent::JobStatus;
use berth_client::alloc_runner::AllocStatus;
use berth_harness::AgentProcess;
use berth_model::events::{EventKind, TaskStateKind};
use berth_model::status::ClientStatus;

use crate::support;

/// A service task that records its pid and runs until a file appears in its `local/`.
const WAITER: &str = r#"job "waiter" {
  group "g" {
    restart {
      attempts = 3
      delay    = "0s"
      mode     = "fail"
    }
    volume "scratch" {
      type   = "host"
      source = "scratch"
    }
    task "prep" {
      driver = "exec"
      lifecycle { hook = "prestart" }
      config {
        command = "/bin/sh"
        args    = ["-c", "echo prepared > /alloc/data/prep"]
      }
    }
    task "web" {
      driver = "exec"
      kill_timeout = "2s"
      config {
        command = "/bin/sh"
        args    = ["-c", "test -f /alloc/data/prep || exit 9; echo $$ > /local/pid; while [ ! -f /local/stop ]; do sleep 0.05; done; rm /local/stop; exit 3"]
      }
      volume_mount {
        volume      = "scratch"
        destination = "/scratch"
      }
    }
  }
}
"#;

/// A batch job `name` with one mock task `t` that finishes at once.
fn mock_batch(name: &str) -> String {
    format!(
        "job \"{name}\" {{\n  type = \"batch\"\n  group \"g\" {{\n    task \"t\" {{\n      driver = \"mock\"\n      config {{ run_for = \"0s\" }}\n    }}\n  }}\n}}\n"
    )
}

/// Kills a task process the test started through an agent, whatever the test's outcome.
/// Holds a pidfd, so a pid reused after the task is gone is never hit.
struct KillOnDrop(rustix::fd::OwnedFd);

impl KillOnDrop {
    fn new(pid: u32) -> KillOnDrop {
        let pid = rustix::process::Pid::from_raw(pid as i32).unwrap();
        KillOnDrop(rustix::process::pidfd_open(pid, rustix::process::PidfdFlags::empty()).unwrap())
    }
}

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        let _ = rustix::process::pidfd_send_signal(&self.0, rustix::process::Signal::KILL);
    }
}

/// Running, not gone or a zombie (an orphan is reaped by whatever init the machine has).
fn alive(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|stat| {
            let state = stat.rsplit_once(") ")?.1.chars().next()?;
            Some(state != 'Z' && state != 'X')
        })
        .unwrap_or(false)
}

fn mount_count(pid: u32) -> usize {
    std::fs::read_to_string(format!("/proc/{pid}/mountinfo"))
        .unwrap()
        .lines()
        .count()
}

fn host_mount_count() -> usize {
    std::fs::read_to_string("/proc/self/mountinfo")
        .unwrap()
        .lines()
        .count()
}

fn task_running(status: &AllocStatus, task: &str) -> bool {
    status.tasks[task].state == TaskStateKind::Running
}

/// Starts the agent, runs WAITER until its `web` task has written its pid: the alloc's
/// id and status, and the task's pid on the host (it wrote the one of its namespace).
async fn waiter_running(agent: &mut AgentProcess) -> (String, AllocStatus, u32) {
    agent.start().await;
    let submitted = agent.submit("waiter.hcl", WAITER).await.unwrap();
    let id = submitted.alloc_ids[0].clone();
    agent
        .wait_alloc(&id, "web running", |s| task_running(s, "web"))
        .await;
    let status = agent.alloc(&id).await;
    let pid_file = status.alloc_dir.join("tasks/web/local/pid");
    let deadline = Instant::now() + Duration::from_secs(10);
    while !pid_file.exists() {
        assert!(Instant::now() < deadline, "the task never wrote its pid");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let ns_pid: u32 = std::fs::read_to_string(&pid_file)
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    let pid = support::host_pid_of(&status.alloc_dir, ns_pid).expect("the task's host pid");
    (id, status, pid)
}

#[tokio::test(flavor = "multi_thread")]
async fn a_running_task_survives_kill_9_of_the_agent_and_is_supervised_again() {
    let mut agent = AgentProcess::new();
    let (id, status, pid) = waiter_running(&mut agent).await;
    // The prestart task ran to completion before the main task started.
    assert_eq!(status.tasks["prep"].state, TaskStateKind::Dead);
    assert_eq!(status.tasks["prep"].exit_code, Some(0));
    let local = status.alloc_dir.join("tasks/web/local");
    // If an assertion below fails, the task must not outlive the test.
    let _reaper = KillOnDrop::new(pid);
    let task_mounts = mount_count(pid);
    let host_mounts = host_mount_count();

    agent.kill9();
    assert!(alive(pid), "the task died with the agent");

    let me = agent.start().await;
    assert!(
        me.notices
            .iter()
            .any(|n| n.contains("restoring 1 alloc(s)")),
        "{:?}",
        me.notices
    );
    let restored = agent.alloc(&id).await;
    assert_eq!(restored.client_status, ClientStatus::Running);
    assert!(task_running(&restored, "web"), "{restored:#?}");
    assert_eq!(restored.tasks["web"].restarts, 0);
    // Recovered, not started again: the same process, with the same mounts, and
    // nothing new mounted on the host.
    assert!(
        !restored.tasks["web"]
            .events
            .iter()
            .skip(3)
            .any(|e| e.kind == EventKind::Started),
        "{restored:#?}"
    );
    assert_eq!(mount_count(pid), task_mounts);
    assert_eq!(host_mount_count(), host_mounts);
    // The alloc reads as running from its record at once; the driver's recovery of the
    // task follows, and says so in the log (it lagged the first read once in CI).
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while !agent
        .output()
        .contains("recovered the task after an agent restart")
        && std::time::Instant::now() < deadline
    {
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    assert!(
        agent
            .output()
            .contains("recovered the task after an agent restart"),
        "{}",
        agent.output()
    );

    // Its later exit is observed by the new agent, with its real exit code (from the
    // exit record its shim writes), although the new agent is not its parent.
    std::fs::write(local.join("stop"), "").unwrap();
    agent
        .wait_alloc(&id, "the recovered task's exit", |s| {
            s.tasks["web"]
                .events
                .iter()
                .any(|e| e.kind == EventKind::Terminated)
        })
        .await;
    assert!(!alive(pid));
    let terminated = terminated_messages(&agent.alloc(&id).await, "web");
    assert_eq!(terminated, ["Exit Code: 3"]);
    // The restart policy applies as before: the task runs again.
    agent
        .wait_alloc(&id, "web restarted", |s| {
            s.tasks["web"].restarts == 1 && task_running(s, "web")
        })
        .await;

    // Stopping the job through the CLI kills the restarted task and records the stop.
    let (code, stdout, stderr) = agent.cli(&["job", "stop", "waiter"]);
    assert_eq!(code, 0, "{stdout}{stderr}");
    assert!(stdout.contains("stopping 1 alloc(s)"), "{stdout}");
    agent
        .wait_alloc(&id, "complete", |s| {
            s.client_status == ClientStatus::Complete
        })
        .await;
    let (code, stdout, _) = agent.cli(&["alloc", "status", &id[..8]]);
    assert_eq!(code, 0);
    assert!(stdout.contains("Desired Status = stop"), "{stdout}");
    assert!(stdout.contains("/scratch"), "mounts are shown: {stdout}");
    assert!(stdout.contains("Killed"), "{stdout}");
}

fn terminated_messages(status: &AllocStatus, task: &str) -> Vec<String> {
    status.tasks[task]
        .events
        .iter()
        .filter(|e| e.kind == EventKind::Terminated)
        .map(|e| e.message.clone())
        .collect()
}

/// The task ends while no agent runs: the next agent reports its real exit code (its
/// shim left an exit record), and the restart policy goes on from there.
#[tokio::test(flavor = "multi_thread")]
async fn a_task_that_ends_while_the_agent_is_down_is_reported_with_its_exit_code() {
    let mut agent = AgentProcess::new();
    let (id, status, pid) = waiter_running(&mut agent).await;
    let local = status.alloc_dir.join("tasks/web/local");
    let _reaper = KillOnDrop::new(pid);

    agent.kill9();
    std::fs::write(local.join("stop"), "").unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    while alive(pid)
        || !support::processes_rooted_under(&status.alloc_dir.join("tasks/web")).is_empty()
    {
        assert!(Instant::now() < deadline, "the task did not end");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }

    agent.start().await;
    agent
        .wait_alloc(&id, "web restarted after its recorded exit", |s| {
            s.tasks["web"].restarts == 1 && task_running(s, "web")
        })
        .await;
    let status = agent.alloc(&id).await;
    assert_eq!(terminated_messages(&status, "web"), ["Exit Code: 3"]);
    assert_eq!(status.tasks["web"].exit_code, Some(3));
}

/// Runs `mock_batch(name)` to completion: its alloc's id and directory.
async fn run_mock_batch(agent: &AgentProcess, name: &str) -> (String, std::path::PathBuf) {
    let submitted = agent
        .submit(&format!("{name}.hcl"), &mock_batch(name))
        .await
        .unwrap();
    let id = submitted.alloc_ids[0].clone();
    agent
        .wait_alloc(&id, "complete", |s| {
            s.client_status == ClientStatus::Complete
        })
        .await;
    let dir = agent.alloc(&id).await.alloc_dir;
    (id, dir)
}

/// Finished allocs beyond `gc { max_allocs }` lose their records and directories,
/// oldest first; one with something still mounted in it is kept, and the mount's data
/// with it.
#[tokio::test(flavor = "multi_thread")]
async fn finished_allocs_beyond_max_allocs_are_collected_but_never_through_a_mount() {
    let mut agent = AgentProcess::with_config("gc {\n  max_allocs = 1\n  interval = \"1h\"\n}\n");
    agent.start().await;
    let mut allocs = Vec::new();
    for name in ["first", "second", "third", "fourth"] {
        allocs.push(run_mock_batch(&agent, name).await);
        // Finish times are in milliseconds: keep them apart.
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // The oldest has a mount in it, as a volume that could not be unmounted would.
    let mut mounts = support::HostMounts::default();
    let mounted = allocs[0].1.join("alloc/data/volume");
    mounts.tmpfs(&mounted);
    std::fs::write(mounted.join("precious"), "user data").unwrap();

    let (code, stdout, stderr) = agent.cli(&["system", "gc"]);
    assert_eq!(code, 0, "{stdout}{stderr}");
    assert!(stdout.contains("Collected 2 finished alloc(s)"), "{stdout}");
    for (id, dir) in &allocs[1..3] {
        assert!(stdout.contains(id.as_str()), "{stdout}");
        assert!(!dir.exists(), "{} was not removed", dir.display());
        // Its node's record is gone; the cluster's report of it may stay a while (as
        // Nomad's server keeps an alloc until its own collection), not its details.
        let (code, _, stderr) = agent.cli(&["alloc", "status", id]);
        assert_ne!(code, 0);
        assert!(
            stderr.contains("no alloc matches") || stderr.contains("alloc not found"),
            "{stderr}"
        );
    }
    assert_eq!(
        std::fs::read_to_string(mounted.join("precious")).unwrap(),
        "user data"
    );
    assert!(allocs[3].1.exists());
    assert_eq!(
        agent.alloc(&allocs[0].0).await.client_status,
        ClientStatus::Complete
    );
    drop(mounts);
    let (_, stdout, _) = agent.cli(&["system", "gc"]);
    assert!(
        stdout.contains(&format!("Collected 1 finished alloc(s): {}", allocs[0].0)),
        "{stdout}"
    );
    let (_, stdout, _) = agent.cli(&["system", "gc"]);
    assert!(stdout.contains("Nothing to collect"), "{stdout}");
}

/// A data dir whose disk is fuller than `gc { disk_usage_threshold }` gets its finished
/// allocs collected, oldest first, even within `max_allocs` (as Nomad's client does);
/// below the threshold, `max_allocs` alone decides.
#[tokio::test(flavor = "multi_thread")]
async fn finished_allocs_within_max_allocs_are_collected_when_the_disk_is_fuller_than_the_threshold()
 {
    let used_percent = {
        let stats = rustix::fs::statvfs("/tmp").unwrap();
        100 * (stats.f_blocks - stats.f_bfree) / stats.f_blocks
    };
    assert!(
        used_percent >= 1,
        "the test needs a disk with something on it"
    );
    // Below the usage: under pressure. At 100: never.
    for (threshold, collected) in [(0, true), (100, false)] {
        let mut agent = AgentProcess::with_config(&format!(
            "gc {{\n  max_allocs = 50\n  interval = \"1h\"\n  disk_usage_threshold = {threshold}\n}}\n"
        ));
        agent.start().await;
        let first = run_mock_batch(&agent, "first").await;
        tokio::time::sleep(Duration::from_millis(20)).await;
        let second = run_mock_batch(&agent, "second").await;
        let (code, stdout, stderr) = agent.cli(&["system", "gc"]);
        assert_eq!(code, 0, "{stdout}{stderr}");
        if collected {
            assert!(
                stdout.contains(&format!(
                    "Collected 2 finished alloc(s): {}, {}",
                    first.0, second.0
                )),
                "{stdout}"
            );
            assert!(!first.1.exists() && !second.1.exists());
        } else {
            assert!(stdout.contains("Nothing to collect"), "{stdout}");
            assert!(first.1.exists() && second.1.exists());
        }
    }
}

/// Submitting a job again replaces it: the finished allocs of the old version are
/// collected, records and directories.
#[tokio::test(flavor = "multi_thread")]
async fn a_replaced_jobs_finished_allocs_are_collected() {
    let mut agent = AgentProcess::new();
    agent.start().await;
    let mut allocs = Vec::new();
    for _ in 0..2 {
        allocs.push(run_mock_batch(&agent, "again").await);
    }
    let (old_id, old_dir) = &allocs[0];
    assert!(!old_dir.exists(), "{} was left", old_dir.display());
    let (code, _, _) = agent.cli(&["alloc", "status", old_id]);
    assert_ne!(code, 0);
    assert!(allocs[1].1.exists());
}

#[tokio::test(flavor = "multi_thread")]
async fn bad_input_gets_one_clear_error_and_the_agent_keeps_its_state() {
    let mut agent = AgentProcess::new();
    agent.start().await;
    let good = mock_batch("ok");
    let submitted = agent.submit("ok.hcl", &good).await.unwrap();
    agent
        .wait_alloc(&submitted.alloc_ids[0], "complete", |s| {
            s.client_status == ClientStatus::Complete
        })
        .await;

    let cases = [
        (
            "broken.hcl",
            "job \"x\" {\n  group \"g\" {\n",
            "broken.hcl:",
        ),
        (
            "podman.hcl",
            "job \"x\" {\n  group \"g\" {\n    task \"t\" { driver = \"podman\" }\n  }\n}\n",
            "unknown driver \"podman\"",
        ),
    ];
    for (name, source, expected) in cases {
        let Err(ClientError::Api(error, status)) = agent.submit(name, source).await else {
            panic!("{name} was accepted");
        };
        assert_eq!(status.as_u16(), 400, "{name}");
        let all = format!("{}\n{}", error.error, error.problems.join("\n"));
        assert!(all.contains(expected), "{name}: {all}");
    }
    // The CLI shows the same problems, and exits 2.
    std::fs::write(agent.path().join("podman.hcl"), cases[1].1).unwrap();
    let (code, _, stderr) = agent.cli(&[
        "job",
        "run",
        agent.path().join("podman.hcl").to_str().unwrap(),
    ]);
    assert_eq!(code, 2, "{stderr}");
    assert!(stderr.contains("unknown driver \"podman\""), "{stderr}");
    let (code, _, stderr) = agent.cli(&["alloc", "status", "nope"]);
    assert_eq!(code, 1);
    assert!(stderr.contains("no alloc matches \"nope\""), "{stderr}");

    // A host volume no node has is the scheduler's to find, as in Nomad: the job is
    // accepted and waits, its evaluation naming the volume.
    let novol = agent.submit("novol.hcl", "job \"x\" {\n  group \"g\" {\n    volume \"v\" {\n      type = \"host\"\n      source = \"nowhere\"\n    }\n    task \"t\" {\n      driver = \"exec\"\n      config { command = \"/bin/true\" }\n      volume_mount {\n        volume = \"v\"\n        destination = \"/v\"\n      }\n    }\n  }\n}\n").await.unwrap();
    assert!(novol.alloc_ids.is_empty(), "{novol:?}");
    let evaluation: serde_json::Value = agent
        .client()
        .get(&format!("/v1/evaluation/{}", novol.eval_id))
        .await
        .unwrap();
    let filtered = evaluation["FailedTGAllocs"]["g"]["ConstraintFiltered"].to_string();
    assert!(filtered.contains("nowhere"), "{evaluation:#}");

    // Nothing recorded was lost, and the agent still answers.
    let jobs: Vec<JobStatus> = agent.client().get("/v1/berth/jobs").await.unwrap();
    let ids: Vec<&str> = jobs.iter().map(|j| j.id.as_str()).collect();
    assert_eq!(ids, ["ok", "x"]);

    // A state file that is not a database: one clear error, the file kept, the agent up.
    agent.kill9();
    let state = agent.path().join("data/state.db");
    std::fs::write(&state, vec![0x42_u8; 8192]).unwrap();
    let me = agent.start().await;
    let notice = me
        .notices
        .iter()
        .find(|n| n.contains("could not be read"))
        .unwrap_or_else(|| panic!("{:?}", me.notices));
    assert!(notice.contains("It was kept at"), "{notice}");
    let kept: Vec<_> = std::fs::read_dir(agent.path().join("data"))
        .unwrap()
        .filter_map(|e| e.ok())
        .filter(|e| {
            e.file_name()
                .to_string_lossy()
                .contains("state.db.unreadable-")
        })
        .collect();
    assert_eq!(kept.len(), 1);
    assert_eq!(std::fs::read(kept[0].path()).unwrap(), vec![0x42_u8; 8192]);
    assert!(
        agent.output().contains("Error: the state file"),
        "{}",
        agent.output()
    );
    let submitted = agent.submit("ok.hcl", &good).await.unwrap();
    assert_eq!(submitted.alloc_ids.len(), 1);

    // A missing state file: a fresh start, said so.
    agent.kill9();
    std::fs::remove_file(&state).unwrap();
    let me = agent.start().await;
    assert!(
        me.notices.iter().any(|n| n.contains("starting fresh")),
        "{:?}",
        me.notices
    );
}

#[test]
fn the_cli_says_when_no_agent_is_listening() {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let output = Command::new(env!("CARGO_BIN_EXE_berth"))
        .args(["--address", &format!("http://127.0.0.1:{port}")])
        .args(["job", "status"])
        .output()
        .unwrap();
    let stderr = String::from_utf8(output.stderr).unwrap();
    assert_eq!(output.status.code(), Some(1));
    assert!(stderr.contains("cannot reach the berth agent"), "{stderr}");
    assert!(stderr.contains("berth agent -dev"), "{stderr}");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_python_policy_hook_refuses_a_task_and_alloc_status_shows_why() {
    let hook = support::python_hook();
    // Compile it once into the shared cache (a Python component takes seconds), so the
    // agent below starts from the cache as it would on its second start.
    let warm = berth_client::hook_set::HookSet::load(
        &support::runtime(),
        &[berth_model::hook::HookSpec {
            name: "warm".into(),
            path: hook.clone(),
            config: Vec::new(),
            timeout: std::time::Duration::from_secs(10),
            memory_max: 256 << 20,
            on_failure: berth_model::hook::OnFailure::Fail,
            all_tasks: false,
            sha256: None,
            quota: Default::default(),
        }],
        false,
    )
    .await;
    assert!(warm.refused().is_empty(), "{:?}", warm.refused());
    // raw_exec is enabled, so it is the hook's policy that refuses it.
    let mut agent = AgentProcess::with_config(&format!(
        "plugin \"raw_exec\" {{\n  config {{\n    enabled = true\n  }}\n}}\nhook \"deny-list\" {{\n  path = \"{}\"\n  config = {{ deny_drivers = \"raw_exec\", deny_commands = \"/usr/bin/wget\" }}\n  timeout = \"10s\"\n  memory_max = \"256MiB\"\n  all_tasks = true\n}}\n",
        hook.display()
    ));
    agent.start().await;
    let (code, stdout, _) = agent.cli(&["hook", "list"]);
    assert_eq!(code, 0);
    assert!(stdout.contains("deny-list"), "{stdout}");

    let job = |name: &str, driver: &str, command: &str| {
        format!(
            "job \"{name}\" {{\n  type = \"batch\"\n  group \"g\" {{\n    restart {{\n      attempts = 0\n      mode = \"fail\"\n    }}\n    task \"t\" {{\n      driver = \"{driver}\"\n      config {{ command = \"{command}\" }}\n    }}\n  }}\n}}\n"
        )
    };
    let denied = agent
        .submit("shell.hcl", &job("shell", "raw_exec", "/bin/true"))
        .await
        .unwrap();
    let fetch = agent
        .submit("fetch.hcl", &job("fetch", "exec", "/usr/bin/wget"))
        .await
        .unwrap();
    let allowed = agent
        .submit("ok.hcl", &job("ok", "exec", "/bin/true"))
        .await
        .unwrap();
    for submitted in [&denied, &fetch, &allowed] {
        agent
            .wait_alloc(&submitted.alloc_ids[0], "finished", |s| {
                matches!(
                    s.client_status,
                    ClientStatus::Complete | ClientStatus::Failed
                )
            })
            .await;
    }
    let (code, stdout, _) = agent.cli(&["alloc", "status", &denied.alloc_ids[0]]);
    assert_eq!(code, 0);
    assert!(stdout.contains("Client Status  = failed"), "{stdout}");
    assert!(
        stdout
            .lines()
            .any(|l| l.contains("Setup Failure") && l.contains("hook \"deny-list\""))
            && stdout.contains("policy: task 't' may not use driver 'raw_exec' on this node"),
        "{stdout}"
    );
    let (_, stdout, _) = agent.cli(&["alloc", "status", &fetch.alloc_ids[0]]);
    assert!(
        stdout.contains("policy: command '/usr/bin/wget' is on this node's deny-list"),
        "{stdout}"
    );
    let ok = agent.alloc(&allowed.alloc_ids[0]).await;
    assert_eq!(ok.client_status, ClientStatus::Complete, "{ok:#?}");
    assert!(
        ok.tasks["t"]
            .events
            .iter()
            .any(|e| e.message == "hook \"deny-list\": policy: task 't' allowed"),
        "{ok:#?}"
    );
}

/// A line a driver logs through `berth:host/log` carries, without the driver or the host
/// repeating them, the alloc, the task and the call it was made in (tracing spans).
#[tokio::test(flavor = "multi_thread")]
async fn a_drivers_log_line_carries_its_alloc_task_and_call() {
    let mut agent = AgentProcess::new();
    agent.start().await;
    let submitted = agent
        .submit("spans.hcl", &mock_batch("spans"))
        .await
        .unwrap();
    let alloc_id = &submitted.alloc_ids[0];
    agent
        .wait_alloc(alloc_id, "complete", |s| {
            s.client_status == ClientStatus::Complete
        })
        .await;
    let output = agent.output();
    let line = output
        .lines()
        .find(|line| line.contains("starting mock task t"))
        .unwrap_or_else(|| panic!("the mock driver's log line is missing:\n{output}"));
    let expected = format!(
        "alloc{{alloc_id={alloc_id} job=spans}}:task{{task=t driver=mock}}:plugin_call{{plugin=mock function=start-task}}"
    );
    assert!(
        line.contains(&expected),
        "expected {expected:?} in:\n{line}"
    );
}

/// A finished job whose allocs are all collected is collected too: nothing of it is left
/// to show. A running one, or one submitted again, is kept.
#[tokio::test(flavor = "multi_thread")]
async fn jobs_with_nothing_left_are_collected_and_the_job_list_pages() {
    let mut agent = AgentProcess::with_config("gc {\n  max_allocs = 0\n  interval = \"1h\"\n}\n");
    agent.start().await;
    for name in ["a-job", "b-job", "c-job", "d-job", "e-job"] {
        run_mock_batch(&agent, name).await;
    }
    // Pages of two, in id order, each naming where the next starts.
    let client = agent.client();
    let mut seen = Vec::new();
    let mut path = "/v1/berth/jobs?per_page=2".to_string();
    loop {
        let (page, next): (Vec<berth_client::agent::JobStatus>, Option<String>) =
            client.get_page(&path).await.unwrap();
        assert!(page.len() <= 2);
        seen.extend(page.into_iter().map(|j| j.id));
        match next {
            Some(next) => path = format!("/v1/berth/jobs?per_page=2&next_token={next}"),
            None => break,
        }
    }
    assert_eq!(seen, ["a-job", "b-job", "c-job", "d-job", "e-job"]);
    let (prefixed, _): (Vec<berth_client::agent::JobStatus>, _) =
        client.get_page("/v1/berth/jobs?prefix=c-").await.unwrap();
    assert_eq!(prefixed.len(), 1);

    let (code, stdout, stderr) = agent.cli(&["system", "gc"]);
    assert_eq!(code, 0, "{stdout}{stderr}");
    assert!(stdout.contains("Collected 5 finished alloc(s)"), "{stdout}");
    assert!(
        stdout.contains("Collected 5 job(s) with nothing left: a-job, b-job, c-job, d-job, e-job"),
        "{stdout}"
    );
    let (_, stdout, _) = agent.cli(&["job", "status"]);
    assert!(stdout.contains("No jobs"), "{stdout}");
    // And they stay gone after a restart: their records went too.
    agent.kill9();
    agent.start().await;
    let (_, stdout, _) = agent.cli(&["job", "status"]);
    assert!(stdout.contains("No jobs"), "{stdout}");
}

/// `berth alloc logs` prints a task's own stdout or stderr, byte for byte into a pipe,
/// from a unique prefix of the alloc id; `-f` follows until the alloc has finished.
#[tokio::test(flavor = "multi_thread")]
async fn alloc_logs_prints_a_tasks_own_output_and_follows_it() {
    let mut agent = AgentProcess::new();
    agent.start().await;
    let job = r#"job "talk" {
  type = "batch"
  group "g" {
    task "a" {
      driver = "exec"
      config {
        command = "/bin/sh"
        args    = ["-c", "printf 'one\\ntwo \\033[2J\\n'; echo oops >&2; sleep 1; echo three"]
      }
    }
    task "b" {
      driver = "exec"
      config {
        command = "/bin/sh"
        args    = ["-c", "echo from-b"]
      }
    }
  }
}
"#;
    let submitted = agent.submit("talk.hcl", job).await.unwrap();
    let id = submitted.alloc_ids[0].clone();
    let prefix = &id[..8];
    // Followed while it runs: everything up to the end, then it returns by itself.
    let (code, out, err) = agent.cli(&["alloc", "logs", "-f", prefix, "a"]);
    assert_eq!(code, 0, "{err}");
    assert_eq!(out, "one\ntwo \u{1b}[2J\nthree\n");
    let (code, out, err) = agent.cli(&["alloc", "logs", "-stderr", prefix, "a"]);
    assert_eq!(code, 0, "{err}");
    assert_eq!(out, "oops\n");
    let (_, out, _) = agent.cli(&["alloc", "logs", prefix, "b"]);
    assert_eq!(out, "from-b\n");
    let (code, _, err) = agent.cli(&["alloc", "logs", prefix]);
    assert_ne!(code, 0);
    assert!(err.contains("has several tasks (a, b): name one"), "{err}");
    let (code, _, err) = agent.cli(&["alloc", "logs", prefix, "../etc"]);
    assert_ne!(code, 0);
    assert!(
        err.contains("has no task \"../etc\" (its tasks: a, b)"),
        "{err}"
    );
}

/// A static port is one alloc's on a node, as Nomad's scheduler has it: a job whose
/// alloc would take a port another holds is accepted and waits, its evaluation saying
/// which port, and is placed once the port is free. The holder is untouched meanwhile.
#[tokio::test(flavor = "multi_thread")]
async fn a_static_port_is_one_allocs_and_a_clash_waits_for_it() {
    let mut agent = AgentProcess::new();
    agent.start().await;
    let job = |name: &str, count: u32| {
        format!(
            "job \"{name}\" {{\n  group \"g\" {{\n    count = {count}\n    network {{\n      port \"http\" {{\n        static = 18181\n      }}\n    }}\n    task \"t\" {{\n      driver = \"exec\"\n      config {{\n        command = \"/bin/sleep\"\n        args    = [\"600\"]\n      }}\n      resources {{\n        cpu    = 20\n        memory = 16\n      }}\n    }}\n  }}\n}}\n"
        )
    };
    let first = agent.submit("web.hcl", &job("web", 1)).await.unwrap();
    let running = first.alloc_ids[0].clone();
    agent
        .wait_alloc(&running, "running", |s| {
            s.client_status == ClientStatus::Running
        })
        .await;
    let other = agent.submit("other.hcl", &job("other", 2)).await.unwrap();
    assert!(other.alloc_ids.is_empty(), "{other:?}");
    let evaluation: serde_json::Value = agent
        .client()
        .get(&format!("/v1/evaluation/{}", other.eval_id))
        .await
        .unwrap();
    let failed = &evaluation["FailedTGAllocs"]["g"];
    assert_eq!(
        failed["DimensionExhausted"]["network: reserved port collision 18181"], 1,
        "{evaluation:#}"
    );
    // Its two allocs would share the port too: one group failure, coalesced.
    assert_eq!(failed["CoalescedFailures"], 1, "{evaluation:#}");
    let status = agent.alloc(&running).await;
    assert_eq!(status.client_status, ClientStatus::Running, "untouched");
    // The holder gone, one alloc of the waiting job takes the port; the other waits on.
    agent
        .client()
        .delete::<serde_json::Value>("/v1/job/web")
        .await
        .unwrap();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    loop {
        let allocs: serde_json::Value = agent
            .client()
            .get("/v1/job/other/allocations")
            .await
            .unwrap();
        let running = allocs
            .as_array()
            .unwrap()
            .iter()
            .filter(|a| a["ClientStatus"] == "running")
            .count();
        if running == 1 {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the waiting job was not placed: {allocs:#}"
        );
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    }
}

/// The processes an agent runs beside a task (its shim, its init, its log collector) are
/// the small `berth-keeper` installed beside `berth`, not copies of the agent's binary.
#[tokio::test(flavor = "multi_thread")]
async fn a_tasks_shim_init_and_log_collector_run_berth_keeper() {
    let mut agent = AgentProcess::new();
    let (_, _, task) = waiter_running(&mut agent).await;
    let exe = |pid: u32| std::fs::read_link(format!("/proc/{pid}/exe")).unwrap_or_default();
    let parent = |pid: u32| -> u32 {
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
        let after_name = stat.rsplit_once(')').map(|(_, rest)| rest).unwrap_or("");
        after_name
            .split_whitespace()
            .nth(1)
            .and_then(|p| p.parse().ok())
            .unwrap_or(0)
    };
    let keeper = std::path::PathBuf::from(env!("CARGO_BIN_EXE_berth-keeper"));
    let init = parent(task);
    let shim = parent(init);
    assert_eq!(parent(shim), agent.pid(), "the shim is the agent's child");
    assert_eq!(exe(init), keeper, "the task's init");
    assert_eq!(exe(shim), keeper, "the task's shim");
    // The log collector: the agent's other child whose pipes the task writes into.
    let collectors: Vec<u32> = std::fs::read_dir("/proc")
        .unwrap()
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
        .filter(|&pid| parent(pid) == agent.pid() && pid != shim)
        .filter(|&pid| {
            std::fs::read(format!("/proc/{pid}/cmdline"))
                .unwrap_or_default()
                .split(|&b| b == 0)
                .any(|arg| arg == b"__task-logmon")
        })
        .collect();
    assert!(!collectors.is_empty(), "no log collector under the agent");
    for collector in collectors {
        assert_eq!(exe(collector), keeper, "a log collector");
    }
}

/// A data dir an older berth ran alone (a state file, no cluster store yet): at the
/// first start of this build its jobs and live allocs are imported into the node's
/// one-node cluster, so a running task goes on, supervised, neither stopped as unknown
/// nor placed a second time, and a finished job keeps its history.
#[tokio::test(flavor = "multi_thread")]
async fn a_data_dir_an_older_berth_ran_alone_keeps_its_running_tasks() {
    let mut agent = AgentProcess::new();
    let (id, _, pid) = waiter_running(&mut agent).await;
    let _reaper = KillOnDrop::new(pid);
    let (done, _) = run_mock_batch(&agent, "finished").await;
    agent.kill9();
    // What an older berth left: its state file, and no cluster store.
    let store = agent.path().join("data/cluster.db");
    std::fs::remove_file(&store).unwrap();
    agent.start().await;
    assert!(store.exists());
    let restored = agent.alloc(&id).await;
    assert_eq!(restored.client_status, ClientStatus::Running);
    assert_eq!(restored.tasks["web"].restarts, 0);
    assert!(alive(pid), "the imported task was stopped");
    // Still one alloc of the job, the same, as the cluster shows it.
    let allocs: serde_json::Value = agent
        .client()
        .get("/v1/job/waiter/allocations")
        .await
        .unwrap();
    let ids: Vec<&str> = allocs
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|a| a["ID"].as_str())
        .collect();
    assert_eq!(ids, [id.as_str()], "{allocs:#}");
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert!(alive(pid), "the imported task was stopped after a round");
    let finished: serde_json::Value = agent.client().get("/v1/job/finished").await.unwrap();
    assert_eq!(finished["Status"], "dead", "{finished:#}");
    // Its batch alloc ended before: kept, and not run again.
    assert_eq!(
        agent.alloc(&done).await.client_status,
        ClientStatus::Complete
    );
    let allocs: serde_json::Value = agent
        .client()
        .get("/v1/job/finished/allocations")
        .await
        .unwrap();
    assert_eq!(allocs.as_array().unwrap().len(), 1, "{allocs:#}");
}
