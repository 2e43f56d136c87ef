//! Jobs end to end: jobspec, submit checks, alloc and task runners, host volumes, and the
//! `berth` commands a person runs.

use std::path::Path;
use std::process::Command;
use std::sync::Arc;

use berth_client::alloc_runner::{AllocRunner, NodeContext};
use berth_client::config::AgentConfig;
use berth_client::driver_set::DriverSet;
use berth_model::events::{EventKind, TaskStateKind};
use berth_model::status::ClientStatus;
use berth_state::StateStore;
use berth_sys::cgroup::Cgroups;
use berth_sys::cgroup::layout::Layout;

use crate::support;

const MOUNT_REFUSAL: &str =
    "task \"db\": driver \"raw_exec\" cannot mount volumes, but volume_mount \"data\" asks for one";

/// A temp dir holding host volume sources, an agent config naming them, and a data dir.
struct Agent {
    dir: tempfile::TempDir,
}

impl Agent {
    fn new(read_only_greetings: bool) -> Agent {
        berth_jobspec_hcl::install();
        let dir = tempfile::Builder::new()
            .prefix("berth-e2e-agent")
            .tempdir_in("/tmp")
            .unwrap();
        std::fs::create_dir_all(dir.path().join("greetings")).unwrap();
        std::fs::create_dir_all(dir.path().join("scratch")).unwrap();
        // The demo's task runs as nobody, exec's default user: the operator lets it write.
        std::fs::set_permissions(
            dir.path().join("scratch"),
            std::os::unix::fs::PermissionsExt::from_mode(0o1777),
        )
        .unwrap();
        std::fs::write(dir.path().join("greetings/message.txt"), "hi there\n").unwrap();
        let config = format!(
            "data_dir = \"{root}/data\"\n\
             host_volume \"greetings\" {{\n  path = \"{root}/greetings\"\n  read_only = {read_only_greetings}\n}}\n\
             host_volume \"scratch\" {{\n  path = \"{root}/scratch\"\n}}\n\
             plugin \"raw_exec\" {{\n  config {{\n    enabled = true\n  }}\n}}\n\
             plugin \"mock\" {{\n  config {{\n    enabled = true\n  }}\n}}\n",
            root = dir.path().display()
        );
        std::fs::write(dir.path().join("agent.hcl"), config).unwrap();
        Agent { dir }
    }

    fn path(&self) -> &Path {
        self.dir.path()
    }
}

impl Drop for Agent {
    fn drop(&mut self) {
        support::remove_task_cgroups(&self.path().join("data"));
    }
}

impl Agent {
    fn config(&self) -> AgentConfig {
        AgentConfig::parse_file(&self.path().join("agent.hcl")).unwrap()
    }

    /// What an alloc runner of this agent shares, with state kept in memory.
    fn node(&self, drivers: DriverSet) -> NodeContext {
        let config = self.config();
        let cgroups = berth_sys::cgroup::Cgroups::detect(config.cgroups.clone());
        berth_harness::node_context(
            &self.path().join("data"),
            drivers,
            Arc::new(config),
            Arc::new(StateStore::in_memory()),
            &cgroups,
        )
    }

    fn berth(&self, args: &[&str]) -> (i32, String, String) {
        let output = Command::new(berth_harness::binaries::berth())
            .arg("--config")
            .arg(self.path().join("agent.hcl"))
            .args(args)
            .env("BERTH_DATA_DIR", self.path().join("data"))
            .output()
            .unwrap();
        std::fs::create_dir_all(self.path().join("data")).ok();
        (
            output.status.code().unwrap_or(-1),
            String::from_utf8(output.stdout).unwrap(),
            String::from_utf8(output.stderr).unwrap(),
        )
    }
}

fn example(name: &str) -> String {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../examples")
        .join(name)
        .display()
        .to_string()
}

fn link_cache(agent: &Agent) {
    std::fs::create_dir_all(agent.path().join("data")).unwrap();
    let link = agent.path().join("data/component-cache");
    if !link.exists() {
        std::os::unix::fs::symlink(support::cache_dir(), link).unwrap();
    }
}

#[test]
fn berth_run_runs_the_demo_with_read_only_and_read_write_host_volumes() {
    let agent = Agent::new(true);
    link_cache(&agent);
    let (code, stdout, stderr) = agent.berth(&["run", &example("hello.hcl")]);
    assert_eq!(code, 0, "stdout:\n{stdout}\nstderr:\n{stderr}");
    for expected in [
        "hello.greeter[0]  hello  Received        Task received by client",
        "Task Setup      Building Task Directory",
        "Started         Task started by client",
        "Terminated      Exit Code: 0",
        "the greeting volume says: hi there",
        "wrote /scratch/last-run",
        "the read-only mount refused a write, as it should",
        ": Complete",
    ] {
        assert!(
            stdout.contains(expected),
            "missing {expected:?} in:\n{stdout}"
        );
    }
    // The task wrote through the read-write mount onto the host...
    assert!(agent.path().join("scratch/last-run").exists());
    // ...and could not write through the read-only one.
    assert!(!agent.path().join("greetings/nope").exists());
}

#[test]
fn job_validate_refuses_mounts_for_a_driver_that_declared_none() {
    let agent = Agent::new(false);
    link_cache(&agent);
    let (code, _, stderr) = agent.berth(&["job", "validate", &example("mount-config-error.hcl")]);
    assert_eq!(code, 2, "{stderr}");
    assert!(
        stderr.contains(&format!(
            "mount-config-error.hcl:20:7: job.db.group.db.task.db.volume_mount: {MOUNT_REFUSAL}"
        )),
        "{stderr}"
    );
    let (code, stdout, stderr) = agent.berth(&["run", &example("mount-config-error.hcl")]);
    assert_eq!(code, 2, "{stdout}{stderr}");
    assert!(stderr.contains(MOUNT_REFUSAL), "{stderr}");
    assert!(
        !stdout.contains("Started"),
        "the job must not run: {stdout}"
    );
}

#[test]
fn validate_reports_every_problem_and_the_old_volume_form() {
    let agent = Agent::new(true);
    link_cache(&agent);
    let job = agent.path().join("bad.hcl");
    std::fs::write(
        &job,
        r#"job "bad" {
  group "g" {
    volume "ro" {
      type      = "host"
      source    = "greetings"
    }
    volume "missing" {
      type   = "host"
      source = "nowhere"
    }
    task "a" {
      driver = "exec"
      config { command = "bin/relative" }
      volume_mount {
        volume           = "ro"
        destination      = "/ro"
        propagation_mode = "bidirectional"
      }
    }
    task "b" {
      driver = "podman"
    }
    task "c" {
      driver = "mock"
      resources {
        memory = 900000
      }
      template {
        data          = "x"
        destination   = "local/x"
        change_mode   = "script"
        change_script {
          command = "/local/reload"
        }
      }
      service {
        name     = "c"
        provider = "nomad"
        check {
          type     = "script"
          command  = "/local/healthy"
          interval = "5s"
          timeout  = "1s"
        }
      }
    }
  }
}
"#,
    )
    .unwrap();
    let (code, _, stderr) = agent.berth(&["job", "validate", job.to_str().unwrap()]);
    assert_eq!(code, 2);
    assert!(stderr.contains("has 7 problems"), "{stderr}");
    assert!(
        stderr.contains(
            "script check \"/local/healthy\" of service \"c\" runs inside the task, and task \
             driver \"mock\" cannot run commands inside its tasks"
        ),
        "{stderr}"
    );
    assert!(
        stderr.contains(
            "change_mode = \"script\" runs \"/local/reload\" inside the running task, and task \
             driver \"mock\" cannot run commands inside its tasks: use \"signal\", \"restart\" or \
             \"noop\""
        ),
        "{stderr}"
    );
    assert!(
        stderr.contains("task \"c\" asks for 900000 MiB of memory; this node has "),
        "{stderr}"
    );
    assert!(stderr.contains("host volume \"nowhere\" is not configured on this agent (configured: greetings, scratch)"), "{stderr}");
    assert!(
        stderr.contains(
            "job.bad.group.g.task.a.config: driver \"exec\" (built-in): command \"bin/relative\" must be an absolute path inside \
             the task's chroot, or a bare name looked up in the task's PATH"
        ),
        "{stderr}"
    );
    assert!(stderr.contains("volume_mount \"ro\" uses bidirectional propagation, which needs a read-write volume, but the agent's host_volume \"greetings\" is read-only"), "{stderr}");
    assert!(
        stderr.contains("unknown driver \"podman\" (this agent has: exec, raw_exec, docker, mock)"),
        "{stderr}"
    );

    let old = agent.path().join("old.hcl");
    std::fs::write(&old, "job \"o\" {\n  group \"g\" {\n    volume \"v\" {\n      type = \"host\"\n      config { source = \"scratch\" }\n    }\n    task \"t\" { driver = \"mock\" }\n  }\n}\n").unwrap();
    let (code, _, stderr) = agent.berth(&["job", "validate", old.to_str().unwrap()]);
    assert_eq!(code, 2);
    assert!(stderr.contains("move `source` into the volume block, as in: volume \"v\" { type = \"host\", source = \"scratch\" }"), "{stderr}");
}

/// Starts an alloc of `jobspec` with the built-in drivers, skipping submit checks; it
/// runs in the background.
async fn start_unvalidated(
    agent: &Agent,
    jobspec: &str,
) -> (Arc<AllocRunner>, tokio::task::JoinHandle<ClientStatus>) {
    let runtime = support::runtime();
    let (drivers, problems) = DriverSet::load(&runtime, None, &Default::default()).await;
    assert!(problems.is_empty());
    let job = Arc::new(berth_jobspec_hcl::parse("job.hcl", jobspec).unwrap());
    let alloc = AllocRunner::new(job, 0, 0, agent.node(drivers)).unwrap();
    let running = tokio::spawn(alloc.clone().run());
    (alloc, running)
}

async fn run_unvalidated(agent: &Agent, jobspec: &str) -> Arc<AllocRunner> {
    let (alloc, running) = start_unvalidated(agent, jobspec).await;
    running.await.unwrap();
    alloc
}

#[tokio::test(flavor = "multi_thread")]
async fn the_volumes_hook_refuses_what_submit_would_have_refused() {
    let agent = Agent::new(false);
    // The job never went through validation: the hook still refuses, with the same words.
    let alloc = run_unvalidated(
        &agent,
        r#"job "db" {
  group "db" {
    volume "data" {
      type   = "host"
      source = "scratch"
    }
    task "db" {
      driver = "raw_exec"
      config { command = "/bin/true" }
      volume_mount {
        volume      = "data"
        destination = "/var/lib/db"
      }
    }
  }
}
"#,
    )
    .await;
    let status = alloc.status();
    assert_eq!(status.client_status, ClientStatus::Failed);
    let task = &status.tasks["db"];
    assert_eq!((task.state, task.failed), (TaskStateKind::Dead, true));
    let failure = task
        .events
        .iter()
        .find(|e| e.kind == EventKind::SetupFailure)
        .unwrap();
    assert_eq!(failure.message, format!("volumes: {MOUNT_REFUSAL}"));
    assert!(!task.events.iter().any(|e| e.kind == EventKind::Started));

    let alloc = run_unvalidated(
        &agent,
        r#"job "bidi" {
  group "g" {
    volume "data" {
      type      = "host"
      source    = "scratch"
      read_only = true
    }
    task "t" {
      driver = "exec"
      config { command = "/bin/true" }
      volume_mount {
        volume           = "data"
        destination      = "/data"
        propagation_mode = "bidirectional"
      }
    }
  }
}
"#,
    )
    .await;
    let task = &alloc.status().tasks["t"];
    let failure = task
        .events
        .iter()
        .find(|e| e.kind == EventKind::SetupFailure)
        .unwrap();
    assert_eq!(
        failure.message,
        "volumes: task \"t\": volume_mount \"data\" uses bidirectional propagation, which needs a read-write volume, but volume \"data\" is read-only"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn the_restart_policy_restarts_then_gives_up() {
    let agent = Agent::new(false);
    let alloc = run_unvalidated(
        &agent,
        r#"job "flaky" {
  type = "batch"
  group "g" {
    restart {
      attempts = 2
      delay    = "10ms"
      interval = "1m"
      mode     = "fail"
    }
    task "t" {
      driver = "mock"
      config {
        run_for   = "10ms"
        exit_code = 3
      }
    }
  }
}
"#,
    )
    .await;
    let status = alloc.status();
    assert_eq!(status.client_status, ClientStatus::Failed);
    let task = &status.tasks["t"];
    assert_eq!(task.restarts, 2);
    assert_eq!(task.exit_code, Some(3));
    let kinds: Vec<EventKind> = task.events.iter().map(|e| e.kind).collect();
    assert_eq!(
        kinds.iter().filter(|k| **k == EventKind::Started).count(),
        3
    );
    assert_eq!(
        kinds
            .iter()
            .filter(|k| **k == EventKind::Restarting)
            .count(),
        2
    );
    assert_eq!(kinds.last(), Some(&EventKind::NotRestarting));
}

/// A cgroup hierarchy the agent cannot write: the task fails to start with an event
/// that says why, and nothing is left behind (no cgroup, no process).
#[tokio::test(flavor = "multi_thread")]
async fn a_read_only_cgroup_hierarchy_fails_the_task_with_an_event_and_leaves_nothing() {
    let agent = Agent::new(false);
    let hierarchy = agent.path().join("cgroup-ro");
    let mut mounts = support::HostMounts::default();
    mounts.read_only_tmpfs(&hierarchy);
    let runtime = support::runtime();
    let (drivers, _) = DriverSet::load(&runtime, None, &Default::default()).await;
    let mut node = agent.node(drivers);
    let controllers = ["memory", "cpu", "pids", "devices"]
        .map(|c| (c.to_string(), hierarchy.clone()))
        .into();
    node.sys = Arc::new(berth_sys::LinuxSys::new(Cgroups::with_layout(
        Some(Layout::Legacy { controllers }),
        Default::default(),
    )));
    let job = berth_jobspec_hcl::parse(
        "job.hcl",
        "job \"ro\" {\n  type = \"batch\"\n  group \"g\" {\n    task \"t\" {\n      driver = \"exec\"\n      config {\n        command = \"/bin/sleep\"\n        args = [\"60\"]\n      }\n    }\n  }\n}\n",
    )
    .unwrap();
    let alloc = AllocRunner::new(Arc::new(job), 0, 0, node).unwrap();
    let status = alloc.clone().run().await;
    assert_eq!(status, ClientStatus::Failed);
    let events = &alloc.status().tasks["t"].events;
    let failure = events
        .iter()
        .find(|e| e.kind == EventKind::SetupFailure)
        .unwrap_or_else(|| panic!("{events:#?}"));
    assert_eq!(
        failure.message,
        format!(
            "cgroup: the cgroup hierarchy at {} is read-only: berth cannot create the task's \
             cgroup there (the agent needs it mounted read-write)",
            hierarchy.join("berth/job-ro").display()
        )
    );
    assert!(!events.iter().any(|e| e.kind == EventKind::Started));
    assert_eq!(std::fs::read_dir(&hierarchy).unwrap().count(), 0);
    assert!(support::processes_rooted_under(agent.path()).is_empty());
}

fn open_fds() -> usize {
    std::fs::read_dir("/proc/self/fd").unwrap().count()
}

/// 100 exec tasks started and run to the end, one after the other: the agent's open
/// descriptors and tracked processes are where they were, and no process is left.
/// Descriptors are counted for the whole process, so the test runs itself again alone
/// in a process of its own.
#[tokio::test(flavor = "multi_thread")]
async fn a_hundred_task_runs_leave_no_descriptor_process_or_cgroup_behind() {
    const ALONE: &str = "BERTH_E2E_ALONE";
    if std::env::var_os(ALONE).is_none() {
        let output = Command::new(std::env::current_exe().unwrap())
            .args([
                "--exact",
                "jobs::a_hundred_task_runs_leave_no_descriptor_process_or_cgroup_behind",
                "--test-threads",
                "1",
            ])
            .env(ALONE, "1")
            .output()
            .unwrap();
        let stdout = String::from_utf8_lossy(&output.stdout);
        assert!(
            output.status.success() && stdout.contains("1 passed"),
            "{stdout}{}",
            String::from_utf8_lossy(&output.stderr)
        );
        return;
    }
    let agent = Agent::new(false);
    let runtime = support::runtime();
    let (drivers, _) = DriverSet::load(&runtime, None, &Default::default()).await;
    let node = agent.node(drivers);
    let job = Arc::new(
        berth_jobspec_hcl::parse(
            "job.hcl",
            "job \"cycle\" {\n  type = \"batch\"\n  group \"g\" {\n    task \"t\" {\n      driver = \"exec\"\n      config {\n        command = \"/bin/sh\"\n        args = [\"-c\", \"sleep 30 & exit 0\"]\n      }\n    }\n  }\n}\n",
        )
        .unwrap(),
    );
    let run = async |index: u32| {
        let alloc = AllocRunner::new(job.clone(), 0, index, node.clone()).unwrap();
        assert_eq!(alloc.clone().run().await, ClientStatus::Complete);
        alloc
    };
    // The first run compiles the filter and warms the runtime's caches.
    run(0).await;
    let (fds, tracked) = (open_fds(), runtime.processes().len());
    for index in 1..=100 {
        run(index).await;
    }
    assert_eq!(open_fds(), fds, "descriptors leaked across 100 task runs");
    assert_eq!(runtime.processes().len(), tracked);
    assert_eq!(tracked, 0);
    assert!(support::processes_rooted_under(agent.path()).is_empty());
    let parent = std::path::Path::new("/sys/fs/cgroup/pids/berth");
    // Task cgroups are in their job's level, `job-<job>`.
    let levels: Vec<std::path::PathBuf> = std::fs::read_dir(parent)
        .map(|d| {
            d.flatten()
                .filter(|e| e.file_name().to_string_lossy().starts_with("job-"))
                .map(|e| e.path())
                .collect()
        })
        .unwrap_or_default();
    let cycle_cgroups: usize = levels
        .iter()
        .map(|level| {
            std::fs::read_dir(level)
                .map(|d| {
                    d.flatten()
                        .filter(|e| e.path().join("cgroup.procs").exists())
                        .filter(|e| {
                            agent
                                .path()
                                .join("data/allocs")
                                .join(
                                    e.file_name()
                                        .to_string_lossy()
                                        .split('.')
                                        .next()
                                        .unwrap_or(""),
                                )
                                .exists()
                        })
                        .count()
                })
                .unwrap_or(0)
        })
        .sum();
    assert_eq!(cycle_cgroups, 0, "task cgroups left behind");
    assert!(
        !parent.join("job-cycle").exists(),
        "the job's cgroup outlived its last alloc"
    );
}

/// A driver spawns a process for a task and then fails the start: the task fails with
/// the driver's error, and the process does not outlive the failed start.
#[tokio::test(flavor = "multi_thread")]
async fn a_failed_start_leaves_no_process_behind() {
    let agent = Agent::new(false);
    let plugins = agent.path().join("plugins");
    std::fs::create_dir_all(&plugins).unwrap();
    std::fs::copy(
        berth_builtin::test_components::MISBEHAVE,
        plugins.join("misbehave.wasm"),
    )
    .unwrap();
    let runtime = support::runtime();
    let (drivers, problems) = DriverSet::load(&runtime, Some(&plugins), &Default::default()).await;
    assert!(problems.is_empty(), "{problems:?}");
    let job = berth_jobspec_hcl::parse(
        "job.hcl",
        "job \"failing\" {\n  type = \"batch\"\n  group \"g\" {\n    restart {\n      attempts = 0\n    }\n    task \"t\" {\n      driver = \"misbehave\"\n      config {\n        behave = \"spawn-then-fail\"\n      }\n    }\n  }\n}\n",
    )
    .unwrap();
    let alloc = AllocRunner::new(Arc::new(job), 0, 0, agent.node(drivers)).unwrap();
    assert_eq!(alloc.clone().run().await, ClientStatus::Failed);
    let events = &alloc.status().tasks["t"].events;
    assert!(
        events.iter().any(|e| e.kind == EventKind::DriverFailure
            && e.message
                .contains("misbehave: failing the start after a spawn")),
        "{events:#?}"
    );
    assert!(
        support::processes_rooted_under(agent.path()).is_empty(),
        "the failed start's process outlived it"
    );
    assert_eq!(runtime.processes().owned_by("misbehave"), 0);
}

/// A task that ignores SIGTERM, with a child that ignores it too, is killed after its
/// `kill_timeout`, the child with it.
#[tokio::test(flavor = "multi_thread")]
async fn a_task_that_ignores_sigterm_is_killed_after_its_kill_timeout_with_its_children() {
    let agent = Agent::new(false);
    let (alloc, running) = start_unvalidated(
        &agent,
        "job \"stubborn\" {\n  group \"g\" {\n    task \"t\" {\n      driver = \"exec\"\n      kill_timeout = \"1s\"\n      config {\n        command = \"/bin/sh\"\n        args = [\"-c\", \"trap '' TERM; sleep 7780 & echo up > /local/up; while true; do sleep 1; done\"]\n      }\n    }\n  }\n}\n",
    )
    .await;
    let up = alloc.alloc_dir.task_dir("t").join("local/up");
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while !up.exists() {
        assert!(
            std::time::Instant::now() < deadline,
            "the task never came up"
        );
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    let started = std::time::Instant::now();
    alloc.stop();
    let status = tokio::time::timeout(std::time::Duration::from_secs(10), running)
        .await
        .unwrap()
        .unwrap();
    let took = started.elapsed();
    assert_eq!(status, ClientStatus::Complete);
    assert!(
        took >= std::time::Duration::from_secs(1) && took < std::time::Duration::from_secs(4),
        "stopped after {took:?}"
    );
    let events = &alloc.status().tasks["t"].events;
    let terminated = events
        .iter()
        .find(|e| e.kind == EventKind::Terminated)
        .unwrap_or_else(|| panic!("{events:#?}"));
    assert!(terminated.message.ends_with("Signal: 9"), "{events:#?}");
    assert!(support::processes_rooted_under(agent.path()).is_empty());
}

#[tokio::test(flavor = "multi_thread")]
async fn stopping_an_alloc_kills_its_tasks() {
    let agent = Agent::new(false);
    let (alloc, running) = start_unvalidated(
        &agent,
        "job \"svc\" {\n  group \"g\" {\n    task \"t\" {\n      driver = \"exec\"\n      kill_timeout = \"2s\"\n      config {\n        command = \"/bin/sleep\"\n        args = [\"60\"]\n      }\n    }\n  }\n}\n",
    )
    .await;
    for _ in 0..100 {
        if alloc
            .status()
            .tasks
            .get("t")
            .is_some_and(|t| t.state == TaskStateKind::Running)
        {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    let started = std::time::Instant::now();
    alloc.stop();
    let status = tokio::time::timeout(std::time::Duration::from_secs(10), running)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(status, ClientStatus::Complete);
    assert!(started.elapsed() < std::time::Duration::from_secs(2));
    let task = &alloc.status().tasks["t"];
    let kinds: Vec<EventKind> = task.events.iter().map(|e| e.kind).collect();
    assert!(
        kinds.ends_with(&[EventKind::Killing, EventKind::Terminated, EventKind::Killed]),
        "{kinds:?}"
    );
    assert_eq!((task.state, task.failed), (TaskStateKind::Dead, false));
}

#[tokio::test(flavor = "multi_thread")]
async fn lifecycle_tasks_run_in_order_and_sidecars_stop_with_the_main_task() {
    let agent = Agent::new(false);
    let runtime = support::runtime();
    let (drivers, _) = DriverSet::load(&runtime, None, &Default::default()).await;
    let step = |name: &str, hook: &str, sidecar: bool, script: &str| {
        let lifecycle = if hook.is_empty() {
            String::new()
        } else {
            format!(
                "lifecycle {{\n        hook = \"{hook}\"\n        sidecar = {sidecar}\n      }}"
            )
        };
        format!(
            "    task \"{name}\" {{\n      driver = \"exec\"\n      kill_timeout = \"1s\"\n      {lifecycle}\n      config {{\n        command = \"/bin/sh\"\n        args = [\"-c\", \"{script}\"]\n      }}\n    }}\n"
        )
    };
    let tasks = [
        step(
            "cleanup",
            "poststop",
            false,
            "echo post >> /alloc/data/order",
        ),
        step(
            "main",
            "",
            false,
            "sleep 0.2; echo main >> /alloc/data/order",
        ),
        step(
            "side",
            "prestart",
            true,
            "echo side-up >> /alloc/data/side; exec sleep 60",
        ),
        step(
            "after",
            "poststart",
            false,
            "echo poststart >> /alloc/data/poststart",
        ),
        step(
            "prep",
            "prestart",
            false,
            "sleep 0.2; echo pre >> /alloc/data/order",
        ),
    ]
    .concat();
    let source =
        format!("job \"order\" {{\n  type = \"batch\"\n  group \"g\" {{\n{tasks}  }}\n}}\n");
    let job = Arc::new(berth_jobspec_hcl::parse("order.hcl", &source).unwrap());
    let alloc = AllocRunner::new(job, 0, 0, agent.node(drivers)).unwrap();
    let status = tokio::time::timeout(std::time::Duration::from_secs(30), alloc.clone().run())
        .await
        .expect("the alloc finished");
    let shown = alloc.status();
    assert_eq!(status, ClientStatus::Complete, "{shown:#?}");
    let data = alloc.alloc_dir.shared().join("data");
    let order = std::fs::read_to_string(data.join("order")).unwrap();
    assert_eq!(order, "pre\nmain\npost\n");
    assert_eq!(
        std::fs::read_to_string(data.join("side")).unwrap(),
        "side-up\n"
    );
    assert_eq!(
        std::fs::read_to_string(data.join("poststart")).unwrap(),
        "poststart\n"
    );
    // The sidecar was stopped once the main task was done, and that is not a failure.
    let side = &shown.tasks["side"];
    assert_eq!(side.state, TaskStateKind::Dead);
    assert!(!side.failed, "{side:#?}");
    assert!(side.events.iter().any(|e| e.kind == EventKind::Killed));
    for task in ["prep", "main", "after", "cleanup"] {
        assert_eq!(shown.tasks[task].exit_code, Some(0), "{task}: {shown:#?}");
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn a_failed_prestart_task_keeps_the_main_task_from_starting() {
    let agent = Agent::new(false);
    let runtime = support::runtime();
    let (drivers, _) = DriverSet::load(&runtime, None, &Default::default()).await;
    let source = r#"job "gate" {
  type = "batch"
  group "g" {
    restart {
      attempts = 0
      mode     = "fail"
    }
    task "check" {
      driver = "mock"
      lifecycle { hook = "prestart" }
      config { exit_code = 4 }
    }
    task "main" {
      driver = "mock"
      config { run_for = "0s" }
    }
  }
}
"#;
    let job = Arc::new(berth_jobspec_hcl::parse("gate.hcl", source).unwrap());
    let alloc = AllocRunner::new(job, 0, 0, agent.node(drivers)).unwrap();
    assert_eq!(alloc.clone().run().await, ClientStatus::Failed);
    let status = alloc.status();
    assert!(status.tasks["check"].failed);
    assert_eq!(status.tasks["main"].state, TaskStateKind::Pending);
    assert!(status.tasks["main"].events.is_empty());
}
