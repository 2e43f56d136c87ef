//! The alloc and task runners' logic against `berth_testkit::FakeSys`: task start, restart,
//! stop, a task's user, and the unwind after a failed setup, with the `mock` driver
//! (which spawns nothing). No root needed: nothing here makes a cgroup, changes an
//! owner or reads `/etc/passwd`; the fake records what the runners asked for.

use std::sync::{Arc, OnceLock};
use std::time::Duration;

use super::{AllocRunner, NodeContext};
use crate::config::AgentConfig;
use crate::driver_set::DriverSet;
use berth_model::events::{EventKind, TaskStateKind};
use berth_model::status::ClientStatus;
use berth_runtime::{Runtime, RuntimeConfig};
use berth_testkit::fake_sys::{Call, FakeSys};

/// The built-in drivers, compiled once for every test of this binary.
fn drivers() -> DriverSet {
    static DRIVERS: OnceLock<DriverSet> = OnceLock::new();
    DRIVERS
        .get_or_init(|| {
            std::thread::spawn(|| {
                let rt = tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                    .unwrap();
                rt.block_on(async {
                    let runtime = Runtime::new(RuntimeConfig::new(None)).unwrap();
                    let (set, problems) =
                        DriverSet::load(&runtime, None, &Default::default()).await;
                    assert!(problems.is_empty(), "{problems:?}");
                    set
                })
            })
            .join()
            .unwrap()
        })
        .clone()
}

struct Node {
    node: NodeContext,
    sys: FakeSys,
    _data: tempfile::TempDir,
}

/// The agent config line that enables the mock driver these tests run.
const MOCK_ON: &str = "plugin \"mock\" {\n  config {\n    enabled = true\n  }\n}\n";

fn node() -> Node {
    let data = tempfile::tempdir().unwrap();
    let sys = FakeSys::default();
    let store = Arc::new(berth_state::StateStore::in_memory());
    // The mock driver is off unless enabled, as on any agent.
    let config = AgentConfig::parse("agent.hcl", MOCK_ON).unwrap();
    let (events, _) = tokio::sync::broadcast::channel(1024);
    let node = NodeContext {
        data_dir: data.path().to_path_buf(),
        drivers: drivers(),
        hooks: Default::default(),
        csi: berth_csi::CsiNode::start(data.path(), store.clone(), config.csi.clone()),
        config: Arc::new(config),
        store,
        events,
        sys: Arc::new(sys.clone()),
        services: Arc::new(crate::consul::ServiceClient::disabled()),
        identities: Arc::new(crate::identity::Keyring::detached()),
        dynamic_users: Arc::new(berth_sys::process::dynamic_users::DynamicUsers::new(
            crate::config::DEFAULT_DYNAMIC_RANGE,
        )),
        facts: crate::node::facts(&Default::default()),
    };
    Node {
        node,
        sys,
        _data: data,
    }
}

/// A batch job of mock tasks: `tasks` is the HCL of the group's task blocks.
fn alloc(node: &Node, restart: &str, tasks: &str) -> Arc<AllocRunner> {
    let source = format!(
        "job \"j\" {{\n  type = \"batch\"\n  group \"g\" {{\n    restart {{\n{restart}    }}\n{tasks}  }}\n}}\n"
    );
    let job = Arc::new(berth_jobspec_hcl::parse("j.hcl", &source).unwrap());
    AllocRunner::new(job, 0, 0, node.node.clone()).unwrap()
}

fn mock_task(name: &str, extra: &str, config: &str) -> String {
    format!(
        "    task \"{name}\" {{\n      driver = \"mock\"\n{extra}      config {{\n{config}      }}\n    }}\n"
    )
}

fn cgroup(alloc: &AllocRunner, task: &str) -> String {
    berth_sys::cgroup::Cgroups::task_name(&alloc.job.name, &alloc.id, task)
}

fn events(alloc: &AllocRunner, task: &str) -> Vec<(EventKind, String)> {
    alloc.status().tasks[task]
        .events
        .iter()
        .map(|e| (e.kind, e.message.clone()))
        .collect()
}

async fn finish(alloc: &Arc<AllocRunner>) -> ClientStatus {
    tokio::time::timeout(Duration::from_secs(60), alloc.clone().run())
        .await
        .expect("the alloc finished within a minute")
}

#[tokio::test(flavor = "multi_thread")]
async fn a_task_run_makes_its_cgroup_before_the_start_and_removes_it_after() {
    let node = node();
    let alloc = alloc(&node, "      attempts = 0\n", &mock_task("t", "", ""));
    assert_eq!(finish(&alloc).await, ClientStatus::Complete);
    let name = cgroup(&alloc, "t");
    assert_eq!(
        node.sys.calls(),
        [
            Call::CreateCgroup {
                name: name.clone(),
                memory_bytes: 300 << 20,
            },
            Call::KillAndRemove(name),
        ]
    );
    assert!(node.sys.live_cgroups().is_empty());
    let state = &alloc.status().tasks["t"];
    assert_eq!((state.state, state.failed), (TaskStateKind::Dead, false));
}

/// `attempts = 2` restarts: three runs, each with a cgroup of its own that is gone
/// before the next; then the fail mode fails the alloc.
#[tokio::test(flavor = "multi_thread")]
async fn a_failing_task_is_restarted_by_its_policy_with_a_fresh_cgroup_each_run() {
    let node = node();
    let restart = "      attempts = 2\n      delay = \"10ms\"\n      interval = \"1h\"\n      mode = \"fail\"\n";
    let alloc = alloc(
        &node,
        restart,
        &mock_task("t", "", "        exit_code = 3\n"),
    );
    assert_eq!(finish(&alloc).await, ClientStatus::Failed);
    let name = cgroup(&alloc, "t");
    let runs: Vec<Call> = node
        .sys
        .calls()
        .into_iter()
        .map(|call| match call {
            Call::CreateCgroup { name, .. } => Call::CreateCgroup {
                name,
                memory_bytes: 0,
            },
            other => other,
        })
        .collect();
    let one_run = [
        Call::CreateCgroup {
            name: name.clone(),
            memory_bytes: 0,
        },
        Call::KillAndRemove(name.clone()),
    ];
    assert_eq!(
        runs,
        one_run.iter().cycle().take(6).cloned().collect::<Vec<_>>()
    );
    let state = &alloc.status().tasks["t"];
    assert_eq!(state.restarts, 2);
    assert!(state.failed);
    let kinds: Vec<EventKind> = events(&alloc, "t").into_iter().map(|(k, _)| k).collect();
    assert_eq!(
        kinds
            .iter()
            .filter(|k| **k == EventKind::Terminated)
            .count(),
        3,
        "{kinds:?}"
    );
    assert_eq!(kinds.last(), Some(&EventKind::NotRestarting));
}

/// A stop kills the running task through its driver and removes its cgroup; the alloc
/// ends complete, as Nomad's stopped allocs do.
#[tokio::test(flavor = "multi_thread")]
async fn a_stopped_alloc_kills_its_task_and_removes_its_cgroup() {
    let node = node();
    let task = mock_task(
        "t",
        "      kill_timeout = \"1s\"\n",
        "        run_for = \"1h\"\n",
    );
    let alloc = alloc(&node, "      attempts = 0\n", &task);
    let running = tokio::spawn(alloc.clone().run());
    tokio::time::timeout(Duration::from_secs(30), async {
        while alloc.status().tasks["t"].state != TaskStateKind::Running {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
    .await
    .expect("the task started");
    assert_eq!(node.sys.live_cgroups(), [cgroup(&alloc, "t")]);
    alloc.stop();
    let status = tokio::time::timeout(Duration::from_secs(30), running)
        .await
        .expect("the alloc stopped")
        .unwrap();
    assert_eq!(status, ClientStatus::Complete);
    assert!(node.sys.live_cgroups().is_empty());
    let kinds: Vec<EventKind> = events(&alloc, "t").into_iter().map(|(k, _)| k).collect();
    assert!(kinds.contains(&EventKind::Killing), "{kinds:?}");
    assert_eq!(kinds.last(), Some(&EventKind::Killed), "{kinds:?}");
}

/// A task's `user` is looked up and its own directories are handed to it before its
/// cgroup is made; the shared alloc dirs are not.
#[tokio::test(flavor = "multi_thread")]
async fn a_tasks_user_gets_its_directories_before_it_starts() {
    let node = node();
    let alloc = alloc(
        &node,
        "      attempts = 0\n",
        &mock_task("t", "      user = \"daemon\"\n", ""),
    );
    assert_eq!(finish(&alloc).await, ClientStatus::Complete);
    let calls = node.sys.calls();
    let task_dir = alloc.alloc_dir.task_dir("t");
    assert_eq!(calls[0], Call::LookupUser("daemon".into()));
    assert_eq!(
        calls[1],
        Call::GiveDirs {
            dirs: vec![
                task_dir.join("local"),
                task_dir.join("secrets"),
                task_dir.join("tmp")
            ],
            uid: 1,
        }
    );
    assert!(matches!(&calls[2], Call::CreateCgroup { .. }), "{calls:?}");
}

/// A user the node does not know fails the task's setup, naming the user; nothing is
/// handed over and no cgroup is made.
#[tokio::test(flavor = "multi_thread")]
async fn an_unknown_user_fails_the_setup_before_anything_is_made() {
    let node = node();
    let alloc = alloc(
        &node,
        "      attempts = 0\n",
        &mock_task("t", "      user = \"nosuchuser\"\n", ""),
    );
    assert_eq!(finish(&alloc).await, ClientStatus::Failed);
    assert_eq!(node.sys.calls(), [Call::LookupUser("nosuchuser".into())]);
    let (kind, message) = events(&alloc, "t").pop().unwrap();
    assert_eq!(kind, EventKind::SetupFailure);
    assert!(
        message.contains("\"nosuchuser\" does not exist"),
        "{message}"
    );
}

/// When a prestart task cannot get its cgroup, the main task never starts, nothing is
/// left made, and the alloc fails with the reason on the task that failed.
#[tokio::test(flavor = "multi_thread")]
async fn a_failed_setup_unwinds_and_the_main_task_never_starts() {
    let node = node();
    let prestart = "      lifecycle {\n        hook = \"prestart\"\n      }\n";
    let tasks = [mock_task("prep", prestart, ""), mock_task("app", "", "")].concat();
    let alloc = alloc(&node, "      attempts = 0\n", &tasks);
    node.sys.fail_cgroup(&cgroup(&alloc, "prep"));
    assert_eq!(finish(&alloc).await, ClientStatus::Failed);
    let calls = node.sys.calls();
    assert!(
        !calls.iter().any(
            |c| matches!(c, Call::CreateCgroup { name, .. } if *name == cgroup(&alloc, "app"))
        ),
        "{calls:?}"
    );
    assert!(node.sys.live_cgroups().is_empty());
    let (kind, message) = events(&alloc, "prep").pop().unwrap();
    assert_eq!(kind, EventKind::SetupFailure);
    assert!(message.starts_with("cgroup: "), "{message}");
    let app = &alloc.status().tasks["app"];
    assert_eq!(app.state, TaskStateKind::Pending);
    assert!(app.events.is_empty(), "{:?}", app.events);
}

/// An OOM kill is read from the task's cgroup, not taken from the driver.
#[tokio::test(flavor = "multi_thread")]
async fn an_oom_kill_is_read_from_the_cgroup() {
    let node = node();
    let alloc = alloc(&node, "      attempts = 0\n", &mock_task("t", "", ""));
    node.sys.oom_kill(&cgroup(&alloc, "t"));
    finish(&alloc).await;
    let terminated = events(&alloc, "t")
        .into_iter()
        .find(|(k, _)| *k == EventKind::Terminated)
        .unwrap();
    assert_eq!(terminated.1, "Exit Code: 0, OOM Killed");
}

/// The operator's deny-list holds for the checked drivers by uid as well as by name:
/// `user = "0"` is root. The task fails its setup before anything is made.
#[tokio::test(flavor = "multi_thread")]
async fn a_denied_user_by_number_fails_the_setup() {
    let mut node = node();
    let config = AgentConfig::parse(
        "agent.hcl",
        &format!("{MOCK_ON}user {{\n  denylist = [\"root\"]\n  checked_drivers = [\"mock\"]\n}}\n"),
    )
    .unwrap();
    node.node.config = Arc::new(config);
    let alloc = alloc(
        &node,
        "      attempts = 0\n",
        &mock_task("t", "      user = \"0\"\n", ""),
    );
    assert_eq!(finish(&alloc).await, ClientStatus::Failed);
    assert!(
        !node
            .sys
            .calls()
            .iter()
            .any(|c| matches!(c, Call::CreateCgroup { .. } | Call::GiveDirs { .. })),
        "{:?}",
        node.sys.calls()
    );
    let (kind, message) = events(&alloc, "t").pop().unwrap();
    assert_eq!(kind, EventKind::SetupFailure);
    assert!(message.contains("root"), "{message}");
}

async fn wait_running(alloc: &AllocRunner, task: &str, starts: usize) {
    tokio::time::timeout(Duration::from_secs(30), async {
        loop {
            let started = events(alloc, task)
                .iter()
                .filter(|(kind, _)| *kind == EventKind::Started)
                .count();
            if started >= starts && alloc.status().tasks[task].state == TaskStateKind::Running {
                return;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
    .await
    .expect("the task started");
}

/// A user restart kills the run and starts the task again at once, with a fresh
/// cgroup, even with `attempts = 0` in fail mode: the policy does not count it. A
/// signal goes to the driver and the task keeps running.
#[tokio::test(flavor = "multi_thread")]
async fn a_user_restart_does_not_count_against_the_restart_policy() {
    let node = node();
    let restart = "      attempts = 0\n      mode = \"fail\"\n";
    let task = mock_task(
        "t",
        "      kill_timeout = \"1s\"\n",
        "        run_for = \"1h\"\n",
    );
    let alloc = alloc(&node, restart, &task);
    let running = tokio::spawn(alloc.clone().run());
    wait_running(&alloc, "t", 1).await;

    alloc.restart_tasks(Some("t")).await.unwrap();
    wait_running(&alloc, "t", 2).await;
    // Twice, the second without a task name: every running task.
    alloc.restart_tasks(None).await.unwrap();
    wait_running(&alloc, "t", 3).await;
    alloc.signal_tasks(Some("t"), "SIGHUP").await.unwrap();

    let name = cgroup(&alloc, "t");
    let creates = (node.sys.calls().iter())
        .filter(|call| matches!(call, Call::CreateCgroup { name: n, .. } if *n == name))
        .count();
    assert_eq!(creates, 3, "one cgroup per run");
    let state = alloc.status().tasks["t"].clone();
    assert_eq!(state.state, TaskStateKind::Running);
    assert!(!state.failed);
    assert_eq!(state.restarts, 2);
    let events = events(&alloc, "t");
    let signaled: Vec<&String> = (events.iter())
        .filter(|(kind, _)| *kind == EventKind::RestartSignaled)
        .map(|(_, message)| message)
        .collect();
    assert_eq!(signaled, ["User requested task to restart"; 2]);
    assert!(
        !events
            .iter()
            .any(|(kind, _)| *kind == EventKind::NotRestarting),
        "{events:?}"
    );
    assert!(
        events.contains(&(EventKind::Signaling, "Task being sent signal SIGHUP".into())),
        "{events:?}"
    );

    assert_eq!(
        alloc.restart_tasks(Some("nope")).await,
        Err(super::ActionError::NoSuchTask {
            alloc: alloc.id.clone(),
            task: "nope".into()
        })
    );
    alloc.stop();
    tokio::time::timeout(Duration::from_secs(30), running)
        .await
        .expect("the alloc stopped")
        .unwrap();
    // A finished task is not running: neither a restart nor a signal reaches it.
    let not_running = Err(super::ActionError::Task(
        crate::task_runner::ControlError::NotRunning { task: "t".into() },
    ));
    assert_eq!(alloc.restart_tasks(Some("t")).await, not_running);
    assert_eq!(alloc.signal_tasks(Some("t"), "SIGHUP").await, not_running);
    assert_eq!(
        alloc.restart_tasks(None).await,
        Err(super::ActionError::NothingRunning {
            alloc: alloc.id.clone()
        })
    );
}

/// A stop that comes before the alloc's tasks listen for one (the alloc just placed, a
/// purge or a resubmit stopping it at once) is not lost: the task stops. It used to run
/// on with desired status stop, and a job whose purge waited on it was never purged.
#[tokio::test(flavor = "multi_thread")]
async fn a_stop_before_the_alloc_runs_stops_it() {
    let node = node();
    let alloc = alloc(
        &node,
        "      attempts = 0\n",
        &mock_task("t", "", "        run_for = \"1h\"\n"),
    );
    alloc.stop();
    let ended = tokio::time::timeout(Duration::from_secs(20), alloc.clone().run()).await;
    assert!(
        ended.is_ok(),
        "the stopped alloc still runs: {:?}",
        alloc.status()
    );
}
